"""Envoy's gRPC access log, received by the picker: how a stream's row gets its usage.

Envoy's Lua filter scans the streamed answer for the usage event and ``[DONE]`` and puts
what it found into the ``taskplane`` dynamic-metadata namespace; at the end of the stream
Envoy logs the request, metadata included, over gRPC. The entry finds its call by the
key the picker set when routing, and settles the served attempt: succeeded with the
engine's exact usage, failed (the stream broke off), or cancelled (the client left).
No Python runs per chunk. On taskplane's own Envoy a successful stream's answer never
reaches the picker (two messages per stream: the request's headers and body), so the
entry also says who served it (the upstream address) and after how many tries.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from envoy.data.accesslog.v3 import accesslog_pb2 as al
from envoy.service.accesslog.v3 import als_pb2 as als
from envoy.service.accesslog.v3 import als_pb2_grpc as als_grpc

from taskplane.calls import failures
from taskplane.engines.replica import ReplicaState
from taskplane.epp.book import LogEntry, StreamBook
from taskplane.epp.calls import PickedCall
from taskplane.epp.envoy_names import TP_NAMESPACE
from taskplane.epp.protocol import struct_dict
from taskplane.epp.timing import BurstTiming

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


#: Which replica of a call answered from its upstream address (``Picker.replica_at``).
Resolver = Callable[[PickedCall, str], ReplicaState | None]


def try_began(entry: al.HTTPAccessLogEntry) -> datetime | None:
    """When the answering try began: the request's start plus Envoy's first byte sent upstream."""
    common = entry.common_properties
    if not common.HasField("start_time") or not common.HasField("time_to_first_upstream_tx_byte"):
        return None
    return common.start_time.ToDatetime(tzinfo=UTC) + common.time_to_first_upstream_tx_byte.ToTimedelta()


def upstream_address(entry: al.HTTPAccessLogEntry) -> str:
    """``ip:port`` of the endpoint that answered (of the last try), or "" if none did."""
    sa = entry.common_properties.upstream_remote_address.socket_address
    return f"{sa.address}:{sa.port_value}" if sa.address else ""


async def settle_from_log(picked: PickedCall, md: dict[str, Any], entry: al.HTTPAccessLogEntry, resolve: Resolver) -> None:
    """Settle a call from its access-log entry: a stream, or a unary answer cut off."""
    served = picked.served
    if served is None:  # no exchange saw the answer: the entry names who served, after how many tries
        address = upstream_address(entry)
        tries = entry.common_properties.upstream_request_attempt_count or None
        served = await picked.served_by(resolve(picked, address) if address else None, tries, since=try_began(entry))
    if served is None:
        await (picked.cancelled() if client_left(entry) else picked.settle())
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


async def settle_logged(picked: PickedCall, logged: LogEntry, resolve: Resolver) -> None:
    """Settle a call from its entry unless an exchange did, then give every try Envoy
    counted its row."""
    md, entry = logged
    try:
        if not picked.settled:
            await settle_from_log(picked, md, entry, resolve)
        await picked.reconcile(entry.common_properties.upstream_request_attempt_count, client_left=client_left(entry))
    except Exception as exc:  # one bad entry must not end the log stream
        log.error("access_log_settle_failed", call=picked.key, error=type(exc).__name__, detail=str(exc)[:200])


class AccessLogs(als_grpc.AccessLogServiceServicer):
    """The access-log service; the book says which call an entry settles (``StreamBook.arrive``)."""

    def __init__(self, streams: StreamBook, resolve: Resolver, timing: BurstTiming | None = None) -> None:
        self.streams = streams
        self.resolve = resolve
        self.timing = timing  # Envoy's clock per call (``taskplane.epp.timing``)
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
                if self.timing is not None:
                    self.timing.logged(entry, md.get("first_token_ms"))
                logged = (md, entry)
                picked = self.streams.arrive(str(md.get("call", "")), logged)
                if picked is not None:
                    settling.append(settle_logged(picked, logged, self.resolve))
            if settling:
                # the entries of one message together: their rows share one outbox commit
                # (one after the other, each waited for its own fsync); shielded, so a call
                # taken from the book is settled even if the log stream ends meanwhile. A lone
                # entry (the usual message) needs no gather: one task and two loop turns less
                await asyncio.shield(settling[0] if len(settling) == 1 else asyncio.gather(*settling))
        return als.StreamAccessLogsResponse()
