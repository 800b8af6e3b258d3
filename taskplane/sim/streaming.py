"""One simulated call in flight, its OpenAI response bodies and its SSE stream.

The replica (``sim/http_replica.py``) owns the engine and the clock; this module only shapes
what a call returns: the non-streamed completion, or the chunks vLLM streams (role,
content pieces as the engine decodes them, tool calls, finish, usage, ``[DONE]``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from taskplane.sim.engine import Finished
from taskplane.sim.structured import Choice, chat_message


@dataclass(slots=True, eq=False)
class SimCall:
    """A request on the simulated engine: what it will answer and who waits for it."""

    req_id: str
    prompt_len: int
    text: str  # what is streamed as content (the first choice's content)
    finish_reason: str
    stream: bool
    arrival_wall: float
    done: asyncio.Future[Finished]
    first: asyncio.Future[float]
    choices: list[Choice] = field(default_factory=list)
    logprobs: list[dict[str, Any] | None] = field(default_factory=list)
    completion_tokens: int = 0
    queue: asyncio.Queue[str | None] | None = None
    sent: int = 0
    decoding: bool = False
    finished: Finished | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def usage(call: SimCall, fin: Finished) -> dict[str, Any]:
    completion = call.completion_tokens
    return {"prompt_tokens": call.prompt_len, "total_tokens": call.prompt_len + completion,
            "completion_tokens": completion, "prompt_tokens_details": {"cached_tokens": fin.cached_tokens}}


def completion_body(call: SimCall, fin: Finished, *, chat: bool, cid: str, created: int, model: str) -> dict[str, Any]:
    """The non-streamed ``chat.completion`` / ``text_completion`` object."""
    choices: list[dict[str, Any]] = []
    for i, ch in enumerate(call.choices):
        lp = call.logprobs[i] if i < len(call.logprobs) else None
        if chat:
            choices.append({"index": i, "message": chat_message(ch), "logprobs": lp,
                            "finish_reason": ch.finish_reason, "stop_reason": None})
        else:
            choices.append({"index": i, "text": ch.text, "logprobs": lp, "finish_reason": ch.finish_reason,
                            "stop_reason": None})
    obj = "chat.completion" if chat else "text_completion"
    return {"id": cid, "object": obj, "created": created, "model": model, "choices": choices,
            "usage": usage(call, fin)}


def _sse(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


async def stream(call: SimCall, *, chat: bool, cid: str, created: int, model: str, include_usage: bool,
                 abort: Callable[[SimCall], None]) -> AsyncIterator[bytes]:
    """The SSE body of a streamed call; ``abort`` frees the engine if the client leaves."""
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None, role: bool = False,
              tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(tool_calls)]
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        return {"id": cid, "object": obj, "created": created, "model": model, "choices": [choice]}

    assert call.queue is not None
    try:
        await call.first
        if chat:
            yield _sse(chunk("", None, role=True))
        while True:
            piece = await call.queue.get()
            if piece is None:
                break
            yield _sse(chunk(piece, None))
        fin = call.finished
        if fin is None or fin.error is not None:
            err = {"error": {"message": f"Request failed: {fin.error if fin else 'unknown'}",
                             "type": "InternalServerError", "param": None, "code": 500}}
            yield _sse(err)
            return
        tool_calls = call.choices[0].tool_calls if call.choices else []
        if tool_calls and chat:
            yield _sse(chunk(None, None, tool_calls=tool_calls))
        yield _sse(chunk(None, call.finish_reason))
        if include_usage:
            yield _sse({"id": cid, "object": obj, "created": created, "model": model, "choices": [],
                        "usage": usage(call, fin)})
        yield b"data: [DONE]\n\n"
    finally:
        if call.finished is None:
            abort(call)
