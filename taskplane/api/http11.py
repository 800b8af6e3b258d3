"""The gateway's HTTP/1.1 connection handling: uvicorn's h11 protocol with two guards.

- A connection that does not finish its request headers within ``header_timeout_s``
  (a slow-loris client trickling header bytes) gets a 408 and is closed, instead of
  holding a socket for ever. Bodies have their own deadline in ``limits.read_capped``.
- A connection that sends nothing at all within ``header_timeout_s`` is closed (an idle
  socket held a file descriptor for ever; a thousand of them starved the gateway).
- Client connections are held to the fd limit less ``RESERVE_FDS``: over it, the one
  silent longest is closed, so the gateway keeps descriptors for replicas and probes.
- When ``accept()`` fails for want of file descriptors, the connections that have sent
  nothing for a second are closed at once to free some, and the event loop's error for
  it is logged at most once per ``ACCEPT_LOG_S`` with a count (it filled 277 MB in 45 s).
- Requests h11 cannot parse (malformed request line, a header block over the size
  limit) get DESIGN.md's JSON error body (400, or 431 for oversized headers) rather
  than uvicorn's plain-text 400.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
import weakref
from typing import Any

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

log = structlog.get_logger(__name__)

MAX_HEADER_BYTES = 64 * 1024
#: The accept-failure error is logged at most once per this many seconds.
ACCEPT_LOG_S = 10.0
#: Under fd pressure, connections that sent nothing for this long are closed.
REAP_IDLE_S = 1.0
_ACCEPT_FAILED = "socket.accept() out of system resource"
#: File descriptors kept for the gateway's own connections (replicas, probes, Postgres).
RESERVE_FDS = 128

_live: weakref.WeakSet[GuardedH11Protocol] = weakref.WeakSet()


def _error_body(message: str) -> bytes:
    return json.dumps({"error": {"type": "invalid_request", "message": message}}).encode()


class GuardedH11Protocol(H11Protocol):
    """h11 protocol with a header deadline and JSON protocol errors."""

    header_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._silent_since: float | None = time.monotonic()  # nothing received yet
        _live.add(self)
        if len(_live) > connection_budget():
            _evict_for(self)
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def data_received(self, data: bytes) -> None:
        self._silent_since = None
        if self.conn.their_state is h11.IDLE and self._headers_too_large(data):
            self._send_error(431, f"request header block exceeds the {MAX_HEADER_BYTES}-byte limit")
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._cancel_header_timer()  # the request line and headers are in

    def _headers_too_large(self, data: bytes) -> bool:
        """h11 only limits a header block that arrives in pieces; check the whole one here."""
        pending = self.conn.trailing_data[0] + data
        end = pending.find(b"\r\n\r\n")
        return (end if end >= 0 else len(pending)) > MAX_HEADER_BYTES

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()  # the next request on this keep-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        _live.discard(self)
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if not self.conn.trailing_data[0]:
            if self._silent_since is not None:  # connected, then not a byte: free the socket
                self.transport.close()
            return  # idle between requests: uvicorn's keep-alive timeout handles that
        self._send_error(408, f"request headers not received within {self.header_timeout_s:g} s")

    def send_400_response(self, msg: str) -> None:
        pending = len(self.conn.trailing_data[0])
        if pending > MAX_HEADER_BYTES:
            self._send_error(431, f"request header block exceeds the {MAX_HEADER_BYTES}-byte limit")
        else:
            self._send_error(400, "malformed HTTP request (request line or headers)")

    def _send_error(self, status: int, message: str) -> None:
        body = _error_body(message)
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        try:
            self.transport.write(head + body)
        finally:
            self.transport.close()


_REASONS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large"}


def protocol_class(header_timeout_s: float) -> Any:
    """A protocol class for ``uvicorn.run(http=...)`` with this header deadline."""
    return type("GatewayH11Protocol", (GuardedH11Protocol,), {"header_timeout_s": header_timeout_s})


def server_options(header_timeout_s: float) -> dict[str, Any]:
    """The options both data planes serve the HTTP app with (``uvicorn.run`` or ``uvicorn.Config``)."""
    return {"log_level": "warning", "timeout_keep_alive": 30, "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
            "http": protocol_class(header_timeout_s)}


def connection_budget() -> int:
    """Client connections kept open at most: the fd limit less ``RESERVE_FDS`` for what the
    gateway opens itself (replicas, health probes, Postgres, the outbox)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, soft - RESERVE_FDS) if soft != resource.RLIM_INFINITY else 1 << 30


def _evict_for(newcomer: GuardedH11Protocol) -> None:
    """Over budget: close the connection that has been silent longest (the newcomer itself
    if no other is silent), so idle sockets cannot take the gateway's last descriptors."""
    silent = [p for p in _live if p is not newcomer and p._silent_since is not None and not p.transport.is_closing()]
    victim = min(silent, key=lambda p: p._silent_since or 0.0) if silent else newcomer
    victim.transport.close()


def reap_silent(min_silent_s: float = REAP_IDLE_S) -> int:
    """Close every connection that has sent nothing for ``min_silent_s``; how many."""
    now = time.monotonic()
    victims = [p for p in list(_live) if p._silent_since is not None and now - p._silent_since >= min_silent_s
               and not p.transport.is_closing()]
    for p in victims:
        p.transport.close()
    return len(victims)


class AcceptGuard:
    """The event loop's exception handler for accept failures (EMFILE and kin): free fds by
    closing silent connections, and log the failure once per ``ACCEPT_LOG_S`` with a count.
    Every other error goes to the handler that was there before."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.suppressed = 0
        self.logged_at = float("-inf")

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != _ACCEPT_FAILED:
            if self.previous is not None:
                self.previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        reaped = reap_silent()
        now = time.monotonic()
        if now - self.logged_at < ACCEPT_LOG_S:
            self.suppressed += 1
            return
        log.error("accept_failed", error=str(context.get("exception"))[:200], closed_silent=reaped,
                  repeats_since_last_log=self.suppressed)
        self.logged_at, self.suppressed = now, 0


def install_accept_guard(loop: asyncio.AbstractEventLoop) -> None:
    """Route the loop's accept failures through an ``AcceptGuard`` (once per loop)."""
    current = loop.get_exception_handler()
    if not isinstance(current, AcceptGuard):
        loop.set_exception_handler(AcceptGuard(current))
