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

from taskplane.context import R_GPU, R_MODEL, R_QUEUE_MS, R_REPLICA
from taskplane.engines.registry import ReplicaRegistry
from taskplane.errors import ErrorType
from taskplane.gateway.attempts import Attempt, AttemptLedger
from taskplane.store.records import Outcome

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


def filter_usage_event(event: bytes, usage: dict[str, Any], client_wants_usage: bool) -> bytes | None:
    """Capture usage from the final SSE chunk into ``usage``; hide it if the client did not
    ask for it (``None``: drop the event)."""
    line = event.strip()
    if not line.startswith(b"data:") or line == b"data: [DONE]" or b'"usage"' not in line:
        return event  # most chunks: pass through without parsing (the proxy's hot path)
    try:
        data = json.loads(line[5:])
    except ValueError:
        return event
    u = data.get("usage") if isinstance(data, dict) else None
    if u:
        usage.update(u)
        if not client_wants_usage:
            if not data.get("choices"):
                return None
            data["usage"] = None
            return b"data: " + json.dumps(data).encode()
    return event


class StreamRelay:
    """One streamed attempt, from the upstream response to its settled row.

    ``finish`` releases the attempt's place on the replica and returns the batch it left;
    ``prefilled`` marks its prefill done; ``release`` frees the tenant's in-flight slot.
    """

    def __init__(self, attempt: Attempt, resp: httpx.Response, *, ledger: AttemptLedger, registry: ReplicaRegistry,
                 finish: Callable[[], int], prefilled: Callable[[], None], release: Callable[[], None]) -> None:
        self.attempt = attempt
        self.resp = resp
        self.ledger = ledger
        self.registry = registry
        self.finish = finish
        self.prefilled = prefilled
        self.release = release
        self.ok = False
        self.ttft_ms: float | None = None
        self.usage: dict[str, Any] = {}
        self.settled = False

    def response(self) -> StreamingResponse:
        a, replica = self.attempt, self.attempt.replica
        headers = {R_REPLICA: replica.name, R_GPU: replica.config.gpu, R_QUEUE_MS: f"{a.queue_ms:.1f}", R_MODEL: a.model,
                   "Cache-Control": "no-cache"}
        return ProxyStream(self.body(), self.settle, media_type="text/event-stream", headers=headers)

    async def settle(self) -> None:
        """Release the counters and write the attempt's row exactly once, however the stream
        ended: finished, upstream broke, client went away, or the body never started."""
        if self.settled:
            return
        self.settled = True
        a = self.attempt
        batch_end = self.finish()
        self.release()
        total_ms = a.elapsed_ms()
        ttft_ms = self.ttft_ms
        if self.ok:
            rec = self.ledger.success(a, total_ms, ttft_ms, self.usage, batch_end)
        else:
            rec = self.ledger.failure(a, Outcome.ERROR, ErrorType.REPLICA_ERROR, total_ms, batch_end, ttft_ms)
        self.ledger.completed(a.call, a.decision, ok=self.ok, ttft_ms=ttft_ms, total_ms=total_ms, cached=rec.cached_tokens,
                              completion=rec.completion_tokens, batch=max(a.batch_start, batch_end))
        # A disconnecting client cancels this task; the row must still be written.
        with anyio.CancelScope(shield=True):
            await self.resp.aclose()
            await self.ledger.write(rec)

    async def body(self) -> AsyncIterator[bytes]:
        a, replica = self.attempt, self.attempt.replica
        buf = b""
        failure: str | None = None
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
                    if self.ttft_ms is None and (b'"content"' in event or b'"text"' in event):
                        self.ttft_ms = a.elapsed_ms()
                        self.prefilled()
                    if event.strip() == b"data: [DONE]":
                        self.ok = True
                    elif event.lstrip().startswith(b'data: {"error"'):
                        failure = "reported an error"
                    if out is not None:
                        outs.append(out + b"\n\n")
                if outs:
                    yield b"".join(outs)
            if not self.ok and failure is None:
                failure = "ended the stream before it finished"
        except (httpx.HTTPError, OSError) as exc:
            log.warning("stream_broken", replica=replica.name, error=type(exc).__name__)
            self.registry.mark_failure(replica.name, hard=True)
            failure = f"broke off the stream ({type(exc).__name__})"
        finally:
            if self.ok or failure is None:
                await self.settle()
        if failure is not None and failure != "reported an error":
            # Tokens may already be out, so no retry; but the client is told plainly
            # (the way vLLM reports a failure mid-stream) instead of seeing a silent end.
            err = {"error": {"type": str(ErrorType.REPLICA_ERROR), "message": f"replica {replica.name} {failure}"}}
            yield b"data: " + json.dumps(err).encode() + b"\n\n"
        await self.settle()
