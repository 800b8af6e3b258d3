"""The body deadline (``limits.body_timeout_s``) on the Envoy data plane, kept by the picker.

Envoy has one timer for "the request arrived whole": the connection manager's
``request_timeout``. It is disarmed only when the last decoder filter has passed the
request's end on, and the picker holds a call inside ext_proc's body phase while admission
waits, so that timer would also cut calls that uploaded in time and are merely queued.
The picker sees both ends of the upload instead: the request headers come at once (their
own deadline is Envoy's ``request_headers_timeout``), the body when its last byte arrived
(BUFFERED), or chunk by chunk (a full-duplex Envoy). Between the two it waits for the next
message with the deadline; when it passes, the picker answers 408 with an
ImmediateResponse (Envoy takes one at any point of the stream) and Envoy closes the
connection, whose request was never read to its end. The clock stops when the body is
whole, before admission, so a held call is never cut by it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from taskplane.epp import protocol as P
from taskplane.errors import ErrorType

T = TypeVar("T")

#: ``response.code_details`` of the picker's 408: the local-reply mapper for Envoy's own
#: 408s leaves a reply with these details as the picker wrote it.
DETAILS = "taskplane_body_timeout"


class TimedOut:
    """What ``Inbox.next`` returns when the deadline passed before the next message."""


TIMED_OUT = TimedOut()


class Inbox(Generic[T]):
    """The ext_proc request stream, read one message at a time, optionally by a deadline.

    Without a deadline a message is awaited directly (no task per message: the hot path);
    with one, the read runs as a task that outlives a timeout, so the gRPC stream's own
    iterator is never cancelled half-way through a read."""

    def __init__(self, messages: AsyncIterator[T]) -> None:
        self._it = messages.__aiter__()
        self._pending: asyncio.Future[T] | None = None

    async def next(self, deadline: float | None = None) -> T | TimedOut | None:
        """The next message; None when the stream ended; ``TIMED_OUT`` once ``deadline``
        (``time.monotonic()`` seconds) has passed with nothing new."""
        if deadline is None and self._pending is None:
            try:
                return await self._it.__anext__()
            except StopAsyncIteration:
                return None
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._it.__anext__())
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if not done:
            return TIMED_OUT
        read, self._pending = self._pending, None
        try:
            return read.result()
        except StopAsyncIteration:
            return None

    def close(self) -> None:
        """Drop a read still waiting (the exchange is over)."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


class BodyClock:
    """When the upload of one request's body must be complete (None: no upload running)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.deadline: float | None = None

    def start(self) -> None:
        """The request headers came and a body follows."""
        self.deadline = time.monotonic() + self.timeout_s

    def stop(self) -> None:
        """The body is whole (or the exchange is answered)."""
        self.deadline = None


def body_timeout_reply(timeout_s: float, received: int | None = None) -> pb.ProcessingResponse:
    """The 408 the Python proxy sends for a slow or stalled upload, same type and wording
    (how much arrived only when the picker saw the chunks: a buffering Envoy keeps them)."""
    arrived = f" ({received} bytes arrived)" if received is not None else ""
    body = {"error": {"type": str(ErrorType.INVALID_REQUEST),
                      "message": f"request body not received within {timeout_s:g} s{arrived}"}}
    return P.immediate(408, json.dumps(body).encode(), {"content-type": "application/json"}, details=DETAILS)
