"""Relaying a streamed (server-sent events) upstream response to the client.

Events pass through unparsed, except the one that carries usage: its numbers go into
the attempt's row, and it is hidden unless the client asked for usage. The first
content event marks the time to first token and the end of the replica's prefill.
However the stream ends — finished, upstream broken, client gone, or body never
started — the attempt is settled exactly once: counters released, row written.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx
import structlog
from fastapi.responses import StreamingResponse

from taskplane.calls import failures
from taskplane.calls.attempts import Attempt, token_count
from taskplane.calls.bodies import filter_usage_event
from taskplane.calls.failures import Failure
from taskplane.calls.lifecycle import AttemptLifecycle
from taskplane.context import R_GPU, R_MODEL, R_QUEUE_MS, R_REPLICA

log = structlog.get_logger(__name__)


class ProxyStream(StreamingResponse):
    """A streamed upstream response whose bookkeeping runs even if its body never starts
    (client gone before the first byte) or is abandoned mid-way."""

    def __init__(self, content: AsyncIterator[bytes], settle: Callable[[], Awaitable[None]], **kw: Any) -> None:
        super().__init__(content, **kw)
        self._settle = settle

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._settle()



class StreamRelay:
    """One streamed attempt, from the upstream response to its settled attempt.

    ``leave`` frees the tenant's in-flight slot when the stream is over. However the
    stream ends, the attempt is settled through the lifecycle: ``succeeded`` on
    ``[DONE]``, ``failed`` when the replica broke off or ended early, ``cancelled`` (with
    the content events relayed so far as its tokens) when the client went away.
    """

    def __init__(self, attempt: Attempt, resp: httpx.Response, *, lifecycle: AttemptLifecycle,
                 leave: Callable[[], None]) -> None:
        self.attempt = attempt
        self.resp = resp
        self.lifecycle = lifecycle
        self.leave = leave
        self.ok = False
        self.failure: Failure | None = None
        self.generated = 0  # content events relayed: the tokens the client has seen
        self.usage: dict[str, Any] = {}
        self.engine_reported = False  # the engine sent its own error event
        self.settled = False

    def response(self) -> StreamingResponse:
        a, replica = self.attempt, self.attempt.replica
        headers = {R_REPLICA: replica.name, R_GPU: replica.config.gpu, R_QUEUE_MS: f"{a.queue_ms:.1f}", R_MODEL: a.model,
                   "Cache-Control": "no-cache"}
        return ProxyStream(self.body(), self.settle, media_type="text/event-stream", headers=headers)

    async def settle(self) -> None:
        """Settle the attempt exactly once, however the stream ended: finished, upstream
        broke, client went away, or the body never started."""
        if self.settled:
            return
        self.settled = True
        self.leave()
        # A disconnecting client cancels this task; the row must still be written.
        with anyio.CancelScope(shield=True):
            await self.resp.aclose()
            if self.ok:
                await self.lifecycle.succeeded(self.attempt, self.usage)
            elif self.failure is not None:
                await self.lifecycle.failed(self.attempt, self.failure)
            else:
                await self.lifecycle.cancelled(self.attempt, self.generated_tokens())

    def generated_tokens(self) -> int:
        """Tokens generated so far: the engine's count if a usage event came, else the
        content events relayed (one token each, as vLLM streams them)."""
        return token_count(self.usage.get("completion_tokens")) or self.generated

    async def body(self) -> AsyncIterator[bytes]:
        a, replica = self.attempt, self.attempt.replica
        buf = b""
        try:
            async for chunk in self.resp.aiter_bytes():
                replica.saw_progress()
                buf += chunk
                # every complete event of this read goes out in one write: under load a
                # read holds many events, and each write costs a trip through the server
                *events, buf = buf.split(b"\n\n")
                outs = []
                for event in events:
                    out = filter_usage_event(event, self.usage, a.call.client_wants_usage)
                    if b'"content"' in event or b'"text"' in event:
                        self.generated += 1
                        self.lifecycle.first_token(a)
                    if event.strip() == b"data: [DONE]":
                        self.ok = True
                    elif event.lstrip().startswith(b'data: {"error"'):
                        self.engine_reported = True
                        self.failure = failures.broken_stream(replica.name, "reported an error", transport=False)
                    if out is not None:
                        outs.append(out + b"\n\n")
                if outs:
                    yield b"".join(outs)
            if not self.ok and self.failure is None:
                self.failure = failures.broken_stream(replica.name, "ended the stream before it finished", transport=False)
        except (httpx.HTTPError, OSError) as exc:
            log.warning("stream_broken", replica=replica.name, error=type(exc).__name__)
            self.failure = failures.broken_stream(replica.name, f"broke off the stream ({type(exc).__name__})",
                                                  transport=True)
        finally:
            if self.ok or self.failure is None:
                await self.settle()  # finished, or the client went away (the generator is closed)
        if self.failure is not None and not self.engine_reported:
            # Tokens may already be out, so no retry; but the client is told plainly
            # (the way vLLM reports a failure mid-stream) instead of seeing a silent end.
            yield b"data: " + json.dumps(self.failure.error.body()).encode() + b"\n\n"
        await self.settle()
