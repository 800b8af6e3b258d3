"""Envoy's gRPC access log, received by the picker: how a stream's row gets its usage.

Envoy's Lua filter scans the streamed answer for the usage event and ``[DONE]`` and puts
what it found into the ``taskplane`` dynamic-metadata namespace; at the end of the stream
Envoy logs the request, metadata included, over gRPC. The entry finds its call by the
key the picker set when routing, and settles the served attempt: succeeded with the
engine's exact usage, failed (the stream broke off), or cancelled (the client left).
No Python runs per chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import structlog
from envoy.data.accesslog.v3 import accesslog_pb2 as al
from envoy.service.accesslog.v3 import als_pb2 as als
from envoy.service.accesslog.v3 import als_pb2_grpc as als_grpc

from taskplane.epp.calls import PickedCall
from taskplane.epp.envoy_config import TP_NAMESPACE
from taskplane.epp.protocol import struct_dict
from taskplane.gateway import failures

log = structlog.get_logger(__name__)


def stream_usage(md: dict[str, Any]) -> dict[str, Any]:
    """The Lua filter's findings as the OpenAI usage object the ledger reads."""
    usage: dict[str, Any] = {}
    for key in ("prompt_tokens", "completion_tokens"):
        if key in md:
            usage[key] = int(md[key])
    if "cached_tokens" in md:
        usage["prompt_tokens_details"] = {"cached_tokens": int(md["cached_tokens"])}
    return usage


def client_left(entry: al.HTTPAccessLogEntry) -> bool:
    flags = entry.common_properties.response_flags
    return bool(flags.downstream_connection_termination or flags.downstream_remote_reset)


async def settle_from_log(picked: PickedCall, md: dict[str, Any], entry: al.HTTPAccessLogEntry) -> None:
    """Settle a call from its access-log entry: a stream, or a unary answer cut off."""
    served = picked.served
    if served is None:
        await picked.settle()
        return
    if not picked.call.stream:  # a unary body that never came whole (Envoy answered 502)
        if client_left(entry):
            await picked.cancelled()
            return
        failure = failures.broken_response(served.replica.name, "the body broke off")
        await picked.failed(failure)
        await picked.exhausted(failure.error)  # Envoy does not retry once the answer started: the Python proxy's unplaced row
        return
    first_ms = md.get("first_token_ms")
    ttft_ms = None
    if first_ms:
        ttft_ms = max(0.0, float(first_ms) - served.started.timestamp() * 1000.0)
        picked.lc.first_token(served, ttft_ms)
    if md.get("done"):
        await picked.succeeded(stream_usage(md))
    elif client_left(entry):
        await picked.cancelled(int(md.get("completion_tokens") or md.get("events") or 0))
    elif md.get("stream_error"):
        await picked.failed(failures.broken_stream(served.replica.name, "reported an error", transport=False))
    elif md.get("ended"):  # ended early, not reset: the client got the closing error event
        await picked.failed(failures.broken_stream(served.replica.name, "ended the stream before it finished", transport=False))
    else:  # reset (the connection broke or hung): the client's stream was cut
        await picked.failed(failures.broken_stream(served.replica.name, "broke off the stream", transport=True))


class AccessLogs(als_grpc.AccessLogServiceServicer):
    """The access-log service; ``settle`` finds the call an entry is about."""

    def __init__(self, streams: Any) -> None:
        self.streams = streams
        self.entries = 0

    async def StreamAccessLogs(self, request_iterator: AsyncIterator[als.StreamAccessLogsMessage], context: Any) -> als.StreamAccessLogsResponse:
        async for msg in request_iterator:
            settling = []
            for entry in msg.http_logs.log_entry:
                self.entries += 1
                ns = entry.common_properties.metadata.filter_metadata.get(TP_NAMESPACE)
                if ns is None:
                    continue
                md = struct_dict(ns)
                key = str(md.get("call", ""))
                picked = self.streams.pop(key)
                routed = self.streams.recall(key)
                if picked is not None or routed is not None:
                    settling.append(self._settle(picked, routed, md, entry))
            if settling:
                # the entries of one message together: their rows share one outbox commit
                # (one after the other, each waited for its own fsync); shielded, so a call
                # taken from the book is settled even if the log stream ends meanwhile
                await asyncio.shield(asyncio.gather(*settling))
        return als.StreamAccessLogsResponse()

    async def _settle(self, picked: PickedCall | None, routed: PickedCall | None, md: dict[str, Any],
                      entry: al.HTTPAccessLogEntry) -> None:
        """Settle a call waiting for its entry, then give every try Envoy counted its row."""
        call = picked or routed
        assert call is not None
        try:
            if picked is not None:
                await settle_from_log(picked, md, entry)
            tries = entry.common_properties.upstream_request_attempt_count
            await call.reconcile(tries, client_left=client_left(entry))
        except Exception as exc:  # one bad entry must not end the log stream
            log.error("access_log_settle_failed", call=call.key, error=type(exc).__name__, detail=str(exc)[:200])
