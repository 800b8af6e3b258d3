"""The simulated replica's request checks: vLLM's 400/404 answers, before any work.

Every check here is one vLLM makes too, with the same error body
(``{"error": {"message", "type", "param", "code"}}``), so a client that handles
vLLM's refusals handles the simulator's.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from fastapi.responses import JSONResponse

from taskplane.engines.tokenize import chat_tokens, tokenize

MAX_N = 16
MAX_TOP_LOGPROBS = 20


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": _ERROR_TYPES.get(status, "Error"),
                      "param": param, "code": status}}
    return JSONResponse(body, status_code=status)




def require_model(served: str, body: dict[str, Any], adapters: Collection[str] = ()) -> str | None:
    """The LoRA adapter the request names as its model (None: the base model ``served``);
    any other model is vLLM's 404."""
    model = body.get("model")
    if model is None:
        raise ApiError(400, "model is required", "model")
    if model == served:
        return None
    if model in adapters:
        return str(model)
    raise ApiError(404, f"The model `{model}` does not exist.", "model")


def validate_sampling(body: dict[str, Any]) -> None:
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ApiError(400, f"{key} must be at least 1, got {v}.", key)
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise ApiError(400, f"n must be an integer within [1, {MAX_N}], got {n}.", "n")
    if n > 1 and body.get("stream"):
        raise ApiError(400, "n > 1 cannot be streamed by the simulator.", "n")
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise ApiError(400, f"top_logprobs must be within [0, {MAX_TOP_LOGPROBS}], got {top}.", "top_logprobs")
    t = body.get("temperature")
    if t is not None and (not isinstance(t, int | float) or isinstance(t, bool) or not 0 <= t <= 2):
        raise ApiError(400, f"temperature must be within [0, 2], got {t}.", "temperature")
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
        raise ApiError(400, "stop must be a string or a list of strings.", "stop")
    if not isinstance(body.get("stream", False), bool):
        raise ApiError(400, "stream must be a boolean.", "stream")


def check_length(max_model_len: int, prompt_len: int, body: dict[str, Any]) -> None:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    limit = max_model_len
    if max_tokens is None:
        if prompt_len >= limit:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, your "
                                f"request has {prompt_len} input tokens. Please reduce the length of the "
                                "input messages.", "messages")
        return
    if prompt_len + max_tokens > limit:
        raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                            f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in "
                            "the completion). Please reduce the length of the messages or completion.", "messages")


def chat_prompt(body: dict[str, Any]) -> list[int]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "messages must be a non-empty list.", "messages")
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, "each message must be an object with a role.", "messages")
    return chat_tokens(msgs)


def completion_prompt(body: dict[str, Any]) -> list[int]:
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str | list):
        p = p[0]
    if isinstance(p, str):
        toks = tokenize(p)
    elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        if any(t < 0 or t > 255 for t in p):
            raise ApiError(400, "token ids must be within the vocabulary (0..255).", "prompt")
        toks = list(p)
    else:
        raise ApiError(400, "prompt must be a string, a list of token ids, or a list with one of those.",
                       "prompt")
    if not toks:
        raise ApiError(400, "prompt must not be empty.", "prompt")
    return toks
