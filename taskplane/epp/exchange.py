"""What one ext_proc stream (one HTTP request through Envoy) has seen so far, and what its
gRPC metadata and headers say about it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm

from taskplane.epp.calls import PickedCall
from taskplane.epp.envoy_names import EXCHANGE_HEADER

#: The body modes in which Envoy streams a body to the picker in chunks (full duplex).
DUPLEX = (pm.ProcessingMode.FULL_DUPLEX_STREAMED, pm.ProcessingMode.STREAMED)


@dataclass
class Exchange:
    """What one ext_proc stream (one HTTP request) has seen so far."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    path: str = ""
    kind: str | None = None
    body: bytearray = field(default_factory=bytearray)
    request_duplex: bool = False
    response_duplex: bool = False
    picked: PickedCall | None = None
    status: int = 0
    response_body: bytearray = field(default_factory=bytearray)
    sse_buf: bytes = b""
    usage: dict[str, Any] = field(default_factory=dict)
    stream_done: bool = False
    engine_reported: bool = False  # the engine's own error event came (a duplex stream)
    generated: int = 0  # content events relayed (a duplex stream the client left: its tokens)
    details: str = ""  # Envoy's response code details (``upstream_per_try_idle_timeout``: the try timed out)
    exchange: str | None = None  # taskplane's filter that opened the stream (``EXCHANGE_HEADER``), or None
    waits_for_log: bool = False  # a stream whose row the access log settles (the Lua filter's usage)
    headers_as_attributes: bool = False  # the headers came with the body (one message: ``envoy_filters``)


def attempt_count(headers: dict[str, str]) -> int | None:
    """Envoy's tries for this request (``x-envoy-attempt-count``), when it says."""
    value = headers.get("x-envoy-attempt-count", "")
    return int(value) if value.isdigit() and int(value) >= 1 else None


def exchange_of(context: Any) -> str | None:
    """Which of taskplane's filters opened this ext_proc stream (``EXCHANGE_HEADER``), or
    None: a GIE-style filter that sends every phase it wants on one stream."""
    for key, value in (context.invocation_metadata() if context is not None else None) or ():
        if key == EXCHANGE_HEADER:
            return str(value)
    return None
