"""The OpenAI endpoints beyond chat and text completions: ``/v1/responses`` and ``/v1/embeddings``.

They go through the same intake, placement, retries and cost rows as chat calls; what
differs per endpoint is here: the request model, the prompt's tokens (for the KV-block
hashes and the context check), the upstream path, and where the reply keeps its usage.
vLLM serves both endpoints itself, so the body is forwarded as it came.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from taskplane.calls.requests import ChatRequest, CompletionRequest, message_dicts
from taskplane.engines.tokenize import chat_token_string, token_string, tokenize

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses",
         "embeddings": "/v1/embeddings"}


class ResponsesRequest(BaseModel):
    """The fields of a Responses request the gateway acts on; the rest passes through."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=256)
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    stream: bool = False

    @property
    def wanted_tokens(self) -> int | None:
        return self.max_output_tokens

    def messages(self) -> list[dict[str, Any]]:
        items = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input
        msgs = [{"role": "system", "content": self.instructions}] if self.instructions else []
        for item in items:
            content = item.get("content", item.get("output", item.get("arguments", "")))
            msgs.append({"role": str(item.get("role", "tool" if "output" in item else "assistant")), "content": content})
        return msgs


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=256)
    input: str | list[str] | list[int] | list[list[int]] = Field(min_length=1)
    stream: bool = False
    temperature: float | None = None

    @property
    def wanted_tokens(self) -> int | None:
        return 1  # prefill only

    def token_lists(self) -> list[list[int]]:
        raw = self.input
        if isinstance(raw, str):
            return [tokenize(raw)]
        if all(isinstance(t, int) for t in raw):
            return [list(raw)]  # type: ignore[arg-type]
        return [tokenize(x) if isinstance(x, str) else list(x) for x in raw]  # type: ignore[arg-type]


REQUEST_MODELS: dict[str, type[BaseModel]] = {"chat": ChatRequest, "completions": CompletionRequest,
                                               "responses": ResponsesRequest, "embeddings": EmbeddingsRequest}


def prompt_tokens(typed: BaseModel) -> Sequence[int]:
    """The prompt's tokens as the engine will count them (the first input for embeddings);
    text prompts as ``bytes`` (byte-level tokens, see ``engines.tokenize``)."""
    if isinstance(typed, ChatRequest):
        return chat_token_string(message_dicts(typed))
    if isinstance(typed, CompletionRequest):
        text = typed.prompt_text
        return token_string(text) if text is not None else typed.prompt_ids or []
    if isinstance(typed, ResponsesRequest):
        return chat_token_string(typed.messages())
    assert isinstance(typed, EmbeddingsRequest)
    return [t for toks in typed.token_lists() for t in toks]


def reply_usage(kind: str, data: Any) -> dict[str, Any]:
    """The reply's usage in chat-completion terms; ValueError when the reply is not of its kind."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    shape = {"responses": "output", "embeddings": "data"}.get(kind, "choices")
    if not isinstance(data.get(shape), list):
        raise ValueError(f"not an OpenAI {kind} object")
    usage = data.get("usage") or {}
    if not isinstance(usage, dict):
        raise ValueError("usage is not an object")
    if kind == "responses":
        details = usage.get("input_tokens_details") or {}
        return {"prompt_tokens": usage.get("input_tokens"), "completion_tokens": usage.get("output_tokens"),
                "prompt_tokens_details": {"cached_tokens": details.get("cached_tokens", 0)
                                          if isinstance(details, dict) else 0}}
    return usage
