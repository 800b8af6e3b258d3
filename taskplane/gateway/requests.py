"""Validation of OpenAI request bodies: a malformed body is a clear 400, never a 500.

Only the fields the gateway acts on are typed; everything else passes through to the
engine untouched (``extra="allow"``), as an OpenAI-compatible proxy should.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from taskplane.errors import ErrorType, TaskplaneError, describe_validation


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer", "function"]
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    stop: str | list[str] | None = None

    @property
    def wanted_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)


class CompletionRequest(_Common):
    prompt: str | list[str] = Field(min_length=1)

    @field_validator("prompt")
    @classmethod
    def _single(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("exactly one prompt per request is supported")
        return v

    @property
    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def _explain(exc: ValidationError) -> str:
    return describe_validation(exc, limit=3, top="body")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:32]} is out of range for a JSON number")
    return value


def parse_body(raw: bytes, kind: type[_Common]) -> tuple[_Common, dict[str, Any]]:
    """Decode and validate a request body; return the typed view and the raw dict to forward."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TaskplaneError(ErrorType.INVALID_REQUEST, "request body is not valid UTF-8") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise TaskplaneError(ErrorType.INVALID_REQUEST, f"request body is not valid JSON: {exc.msg} at position {exc.pos}") from None
    except RecursionError:
        raise TaskplaneError(ErrorType.INVALID_REQUEST, "request body is nested too deeply") from None
    except ValueError as exc:  # NaN / Infinity: not JSON, and engines choke on them
        raise TaskplaneError(ErrorType.INVALID_REQUEST, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TaskplaneError(ErrorType.INVALID_REQUEST, "request body must be a JSON object")
    try:
        typed = kind.model_validate(data)
    except ValidationError as exc:
        raise TaskplaneError(ErrorType.INVALID_REQUEST, f"invalid request: {_explain(exc)}") from None
    return typed, data


def message_dicts(req: ChatRequest) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=False) for m in req.messages]
