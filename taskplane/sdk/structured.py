"""Structured output: ``response_format=`` a pydantic model or a JSON schema, ``response.parsed``.

The request asks the engine for ``json_schema`` output (vLLM enforces it by guided
decoding); the reply is still validated here - a model, an engine without structured
outputs, or a truncated reply (``max_tokens``) can break it - and a failure is one
clear, catchable :class:`~taskplane.sdk.errors.StructuredOutputError`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from taskplane.sdk.errors import StructuredOutputError

Format = type[BaseModel] | dict[str, Any]


def _is_model(fmt: Any) -> bool:
    return isinstance(fmt, type) and issubclass(fmt, BaseModel)


def request_format(fmt: Format) -> dict[str, Any]:
    """The OpenAI ``response_format`` body for a model class, a JSON schema, or an OpenAI format dict."""
    if _is_model(fmt):
        assert isinstance(fmt, type)
        return {"type": "json_schema", "json_schema": {"name": fmt.__name__, "schema": fmt.model_json_schema(),
                                                       "strict": True}}
    if not isinstance(fmt, dict):
        raise TypeError(f"response_format must be a pydantic model class or a JSON schema dict, not {type(fmt).__name__}")
    if fmt.get("type") in ("json_schema", "json_object", "text") and ("json_schema" in fmt or fmt["type"] != "json_schema"):
        return fmt  # already an OpenAI response_format
    return {"type": "json_schema", "json_schema": {"name": str(fmt.get("title") or "output"), "schema": fmt}}


def _schema_of(fmt: Format) -> dict[str, Any] | None:
    if isinstance(fmt, dict):
        if fmt.get("type") == "json_schema":
            return dict((fmt.get("json_schema") or {}).get("schema") or {})
        if fmt.get("type") in ("json_object", "text"):
            return None
        return fmt
    return None


def parse_output(text: str, fmt: Format, finish_reason: str | None = None) -> Any:
    """The validated value: a model instance, or the decoded JSON checked against the schema."""
    cut = " (the reply was cut at max_tokens: raise it)" if finish_reason == "length" else ""
    if _is_model(fmt):
        assert isinstance(fmt, type) and issubclass(fmt, BaseModel)
        try:
            return fmt.model_validate_json(text)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            raise StructuredOutputError(
                f"the reply is not a valid {fmt.__name__}{cut}: {errors[:3]}", raw=text, errors=list(errors)) from None
    if isinstance(fmt, dict) and fmt.get("type") == "text":
        return text
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise StructuredOutputError(f"the reply is not JSON{cut}: {exc}", raw=text, errors=[str(exc)]) from None
    schema = _schema_of(fmt)
    if schema is None:
        if isinstance(fmt, dict) and fmt.get("type") == "json_object" and not isinstance(value, dict):
            raise StructuredOutputError("the reply is JSON but not an object", raw=text, errors=["not an object"])
        return value
    import jsonschema

    problems = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(value)]
    if problems:
        raise StructuredOutputError(f"the reply does not match the schema{cut}: {problems[:3]}", raw=text,
                                    errors=problems)
    return value
