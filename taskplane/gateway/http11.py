"""The gateway's HTTP/1.1 connection handling: uvicorn's h11 protocol with two guards.

- A connection that does not finish its request headers within ``header_timeout_s``
  (a slow-loris client trickling header bytes) gets a 408 and is closed, instead of
  holding a socket for ever. Bodies have their own deadline in ``app.read_capped``.
- Requests h11 cannot parse (malformed request line, a header block over the size
  limit) get DESIGN.md's JSON error body (400, or 431 for oversized headers) rather
  than uvicorn's plain-text 400.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_HEADER_BYTES = 64 * 1024


def _error_body(message: str) -> bytes:
    return json.dumps({"error": {"type": "invalid_request", "message": message}}).encode()


class GuardedH11Protocol(H11Protocol):
    """h11 protocol with a header deadline and JSON protocol errors."""

    header_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
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
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if not self.conn.trailing_data[0]:
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
