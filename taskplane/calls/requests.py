"""Validation of OpenAI request bodies: a malformed body is a clear 400, never a 500.

Only the fields the gateway acts on are typed; everything else passes through to the
engine untouched (``extra="allow"``), as an OpenAI-compatible proxy should.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

import numpy as np
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
    """A completion; the prompt is text or, as OpenAI and vLLM accept, token ids (one prompt)."""

    prompt: str | list[str] | list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]] = Field(
        min_length=1)

    @field_validator("prompt")
    @classmethod
    def _single(cls, v: str | list[str] | list[int] | list[list[int]]) -> str | list[str] | list[int] | list[list[int]]:
        if isinstance(v, list) and v and not isinstance(v[0], int) and len(v) != 1:
            raise ValueError("exactly one prompt per request is supported")
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], list) and not v[0]:
            raise ValueError("the prompt's token ids must not be empty")
        return v

    @property
    def prompt_text(self) -> str | None:
        """The prompt's text, or None when it came as token ids."""
        if isinstance(self.prompt, str):
            return self.prompt
        first = self.prompt[0]
        return first if isinstance(first, str) else None

    @property
    def prompt_ids(self) -> list[int] | None:
        """The prompt's token ids, or None when it came as text."""
        p = self.prompt
        if isinstance(p, str):
            return None
        if all(isinstance(t, int) for t in p):
            return [t for t in p if isinstance(t, int)]
        return list(p[0]) if isinstance(p[0], list) else None


def _explain(exc: ValidationError) -> str:
    return describe_validation(exc, limit=3, top="body")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:32]} is out of range for a JSON number")
    return value


#: One decoder for every body (``json.loads`` with hooks builds a new one per call).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


#: Deepest nesting of objects and arrays a body may have. OpenAI bodies need about ten
#: (a tool's JSON schema a few more); engines fail with 500 on a few hundred, which would
#: let one tenant's requests take every replica out.
MAX_DEPTH = 64
#: JSON integers anywhere in a body must fit a signed 64-bit integer (what engines parse
#: them into); typed fields have their own tighter bounds.
INT64 = 2**63


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONG_INTEGER = re.compile(rb"\d{19,}")
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))


def check_document(data: Any, raw: bytes) -> None:
    """Refuse what JSON allows but nothing downstream can take: nesting beyond ``MAX_DEPTH``,
    integers beyond 64 bits, and lone UTF-16 surrogates (``"\\ud800"``) in any string or key
    (they cannot be encoded as UTF-8: not for the engine, the tokenizer, nor Postgres).

    The raw text says cheaply whether a body can hold any of them (a ``\\uD8..`` escape, a
    run of 19 digits, more than ``MAX_DEPTH`` brackets): only such bodies are walked, so
    a 4 MB list of numbers costs a few regex scans, not a Python loop per element."""
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _depth(raw) > MAX_DEPTH:
        raise TaskplaneError(ErrorType.INVALID_REQUEST, f"request body is nested deeper than {MAX_DEPTH} levels")
    strings = b"\\u" in raw and bool(_SURROGATE_ESCAPE.search(raw))
    ints = len(raw) - len(raw.translate(None, b"0123456789")) >= 19 and _longest_digit_run(raw) >= 19
    if strings or ints:
        _walk(data, strings=strings, ints=ints)


def _depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text (brackets inside strings
    do not count): a running sum over the bracket sequence, in numpy."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS).translate(_BRACKETS)
    if not brackets:
        return 0
    return int(np.cumsum(np.frombuffer(brackets, dtype=np.int8), dtype=np.int64).max())


def _longest_digit_run(raw: bytes) -> int:
    """The longest run of ASCII digits in ``raw`` (numpy: a regex tries every position)."""
    arr = np.frombuffer(raw, dtype=np.uint8)
    digit = np.concatenate(([False], (arr >= 0x30) & (arr <= 0x39), [False]))
    edges = np.flatnonzero(digit[1:] != digit[:-1])  # run starts and ends, alternating
    return int((edges[1::2] - edges[::2]).max()) if edges.size else 0


def _walk(data: Any, *, strings: bool, ints: bool) -> None:
    """Find the lone surrogate or the too-large integer the raw text hinted at, and name its field."""
    stack: list[tuple[Any, str, object]] = [(data, "body", None)]
    while stack:
        value, parent, key = stack.pop()
        if isinstance(value, str):
            if strings and not value.isascii() and _has_surrogate(value):
                raise _refuse(parent, key, "holds a lone UTF-16 surrogate (not valid Unicode)")
        elif isinstance(value, bool) or value is None or isinstance(value, float):
            continue
        elif isinstance(value, int):
            if ints and not -INT64 <= value < INT64:
                raise _refuse(parent, key, "is an integer beyond 64 bits")
        else:
            where = _path(parent, key)
            if isinstance(value, dict):
                for k, v in value.items():
                    if strings and not k.isascii() and _has_surrogate(k):
                        raise _refuse(where, None, "has a key with a lone UTF-16 surrogate (not valid Unicode)")
                    stack.append((v, where, k))
            else:
                stack.extend((v, where, i) for i, v in enumerate(value))


def _path(parent: str, key: object) -> str:
    if key is None:
        return parent
    return f"{parent}[{key}]" if isinstance(key, int) else f"{parent}.{str(key)[:40]}"


def _refuse(parent: str, key: object, why: str) -> TaskplaneError:
    return TaskplaneError(ErrorType.INVALID_REQUEST, f"{_path(parent, key)} {why}")


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def parse_body(raw: bytes, kind: type[_Common]) -> tuple[_Common, dict[str, Any]]:
    """Decode and validate a request body; return the typed view and the raw dict to forward."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TaskplaneError(ErrorType.INVALID_REQUEST, "request body is not valid UTF-8") from None
    try:
        data = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise TaskplaneError(ErrorType.INVALID_REQUEST, f"request body is not valid JSON: {exc.msg} at position {exc.pos}") from None
    except RecursionError:
        raise TaskplaneError(ErrorType.INVALID_REQUEST, "request body is nested too deeply") from None
    except ValueError as exc:  # NaN / Infinity: not JSON, and engines choke on them
        raise TaskplaneError(ErrorType.INVALID_REQUEST, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TaskplaneError(ErrorType.INVALID_REQUEST, "request body must be a JSON object")
    check_document(data, raw)
    try:
        typed = kind.model_validate(data)
    except ValidationError as exc:
        raise TaskplaneError(ErrorType.INVALID_REQUEST, f"invalid request: {_explain(exc)}") from None
    return typed, data


def message_dicts(req: ChatRequest) -> list[dict[str, Any]]:
    """The messages' role and content, what the chat template renders (not a full dump:
    that cost a pydantic serialization per message per call)."""
    return [{"role": m.role, "content": m.content} for m in req.messages]
