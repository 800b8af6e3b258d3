"""``/v1/responses`` and ``/v1/embeddings`` on the simulated replica, as vLLM serves them.

A Responses request is translated to the chat request it means (instructions as the
system message, input items as messages, Responses-style tools and ``text.format`` to
their chat forms), served by the same engine path, and the chat result turned back into
a ``response`` object (``output`` items: a message or function calls). Embeddings are a
prefill-only request: the engine spends the prompt's time, the vectors are a seeded
function of the text (same text, same vector; unit length).
"""

from __future__ import annotations

import hashlib
import math
import random
import time
import uuid
from typing import Any

from taskplane.engines.tokenize import tokenize
from taskplane.sim.openai_api import ApiError

DEFAULT_EMBEDDING_DIM = 384


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _input_messages(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ApiError(400, "input must be a string or a non-empty list of items.", "input")
    out: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            raise ApiError(400, "each input item must be an object.", "input")
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": str(item.get("role", "user")), "content": _content_text(item.get("content"))})
        elif kind == "function_call":
            out.append({"role": "assistant", "content": None, "tool_calls": [{
                "id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": str(item.get("output", ""))})
        else:
            raise ApiError(400, f"input item type {kind!r} is not supported by the simulator.", "input")
    return out


def _chat_tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for t in tools or []:
        if not isinstance(t, dict) or t.get("type") != "function":
            raise ApiError(400, "only function tools are supported by the simulator.", "tools")
        out.append({"type": "function", "function": {
            "name": t.get("name"), "description": t.get("description", ""),
            "parameters": t.get("parameters") or {"type": "object", "properties": {}}}})
    return out


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request a Responses request stands for."""
    if body.get("stream"):
        raise ApiError(400, "streaming /v1/responses is not supported by the simulator.", "stream")
    messages = _input_messages(body.get("input"))
    if body.get("instructions"):
        messages.insert(0, {"role": "system", "content": str(body["instructions"])})
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for key in ("temperature", "top_p", "seed", "parallel_tool_calls"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        chat["tools"] = _chat_tools(body["tools"])
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        chat["tool_choice"] = choice
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "output"), "schema": fmt.get("schema") or {}}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    return chat


def chat_to_response(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A ``response`` object from the chat completion that served it."""
    choice = chat["choices"][0]
    msg = choice["message"]
    output: list[dict[str, Any]] = []
    for call in msg.get("tool_calls") or []:
        output.append({"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    if not output:
        output.append({"type": "message", "id": "msg_" + uuid.uuid4().hex, "status": "completed",
                       "role": "assistant", "content": [
                           {"type": "output_text", "text": msg.get("content") or "", "annotations": []}]})
    u = chat["usage"]
    incomplete = choice["finish_reason"] == "length"
    return {
        "id": "resp_" + uuid.uuid4().hex, "object": "response", "created_at": int(time.time()),
        "model": chat["model"], "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output, "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "tool_choice": request.get("tool_choice", "auto"), "tools": request.get("tools") or [],
        "instructions": request.get("instructions"), "temperature": request.get("temperature"),
        "usage": {"input_tokens": u["prompt_tokens"],
                  "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"]},
                  "output_tokens": u["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": u["total_tokens"]},
    }


def embedding_inputs(body: dict[str, Any]) -> list[list[int]]:
    """Token ids of each input (a string, a list of strings, token ids, or lists of them)."""
    raw = body.get("input")
    items: list[Any] = [raw] if isinstance(raw, str) or (
        isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw)) else raw or []
    if not isinstance(items, list) or not items:
        raise ApiError(400, "input must be a string, a list of strings or token ids.", "input")
    out: list[list[int]] = []
    for item in items:
        toks = tokenize(item) if isinstance(item, str) else item
        if not isinstance(toks, list) or not toks or not all(isinstance(t, int) and 0 <= t < 256 for t in toks):
            raise ApiError(400, "each input must be a non-empty string or list of token ids (0..255).", "input")
        out.append(toks)
    return out


def embedding(tokens: list[int], dim: int, seed: int) -> list[float]:
    """A unit vector that depends only on the tokens, the dimension and the replica's seed."""
    h = hashlib.blake2b(bytes(tokens) + seed.to_bytes(8, "little", signed=True), digest_size=8, person=b"tp-simemb")
    rng = random.Random(int.from_bytes(h.digest(), "little"))
    vec = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def embeddings_body(body: dict[str, Any], inputs: list[list[int]], model: str, seed: int) -> dict[str, Any]:
    dim = body.get("dimensions") or DEFAULT_EMBEDDING_DIM
    if not isinstance(dim, int) or isinstance(dim, bool) or not 1 <= dim <= 4096:
        raise ApiError(400, f"dimensions must be within [1, 4096], got {dim}.", "dimensions")
    if body.get("encoding_format", "float") != "float":
        raise ApiError(400, "encoding_format must be 'float' on the simulator.", "encoding_format")
    n = sum(len(t) for t in inputs)
    data = [{"object": "embedding", "index": i, "embedding": embedding(t, dim, seed)} for i, t in enumerate(inputs)]
    return {"object": "list", "id": "embd-" + uuid.uuid4().hex, "created": int(time.time()), "model": model,
            "data": data, "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}}

