"""How many calls the picker decides per second on one core, at fleet size.

    python -m benchmarks.picker_decisions --replicas 256 --calls 5000

Drives the real ``Picker`` (intake, admission, the taskplane scheduler, the attempt
lifecycle with a row sink that journals each attempt as the cost writer
does and stores nothing, the response's settling) with ext_proc messages as
Envoy sends them, over a registry of N replicas that report free KV room; no network
and no Envoy, so the figure is the picker's own work per call (the gRPC transport adds
its cost on top; docs/benchmarks.md reports both). The messages are built and
serialized before the clock starts, and each access-log entry's building is taken off it
(that is Envoy's work); parsing each message and serializing every answer is counted, as
the picker does both behind gRPC.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.data.accesslog.v3 import accesslog_pb2 as al
from envoy.service.accesslog.v3 import als_pb2 as als
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from taskplane.calls.attempts import AttemptSink
from taskplane.calls.metrics import GatewayMetrics
from taskplane.calls.service import CallService
from taskplane.calls.wiring import build_placer
from taskplane.config import GatewayConfig
from taskplane.engines.registry import ReplicaRegistry
from taskplane.epp.accesslog import AccessLogs
from taskplane.epp.book import StreamBook
from taskplane.epp.endpoints import EndpointBook
from taskplane.epp.envoy_names import EXCHANGE_HEADER, TP_NAMESPACE
from taskplane.epp.protocol import fill_struct
from taskplane.epp.server import Picker
from taskplane.logs import configure_logging

MODEL = "llama-3.1-8b"


def fleet_config(replicas: int) -> GatewayConfig:
    urls = [{"url": f"http://10.{i // 250}.{i % 250}.1:8000", "gpu": "h100", "name": f"r{i}", "kv_blocks": 8192,
             "block_size": 16} for i in range(replicas)]
    return GatewayConfig.model_validate({
        "pools": [{"model": MODEL, "max_context_tokens": 8192, "replicas": urls}],
        "tenants": [{"id": "bench", "max_priority": "critical", "max_concurrent": 1_000_000}],
        "auth": False,
        "scheduler": {"policy": "taskplane", "seed": 0},
    })


def _headers(pairs: dict[str, str], eos: bool = False) -> pb.HttpHeaders:
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode())
                                                              for k, v in pairs.items()]), end_of_stream=eos)


def _as_attributes(headers: pb.HttpHeaders, body: pb.HttpBody) -> pb.ProcessingRequest:
    """The one-message form taskplane's Envoy sends: the body with the headers as request attributes."""
    attrs = struct_pb2.Struct()
    for h in headers.headers.headers:
        name = {":method": "request.method", ":path": "request.path"}.get(h.key, f"request.headers['{h.key}']")
        attrs.fields[name].string_value = h.raw_value.decode()
    return pb.ProcessingRequest(request_body=body, attributes={"envoy.filters.http.ext_proc": attrs})


def exchange(i: int, stream: bool = False) -> tuple[list[pb.ProcessingRequest], Any]:
    """The messages Envoy sends for one chat call: the request's, and a function of the chosen
    endpoint for the response's. Unary: a GIE-style Envoy's headers and body each way.
    ``stream``: taskplane's Envoy, the body alone with the headers as attributes, and no
    response message (the Lua filter and the access log have the answer)."""
    body = {"model": MODEL, "max_tokens": 16, "stream": stream, "messages": [
        {"role": "system", "content": "You are a careful agent working on ticket triage. " * 8},
        {"role": "user", "content": f"step {i % 7} of task {i // 7}: tool output " + "x " * 40}]}
    session = f"task-{i // 7}"
    usage = {"prompt_tokens": 200, "completion_tokens": 16, "prompt_tokens_details": {"cached_tokens": 128}}
    answer = {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
              "usage": usage}
    headers = _headers({":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json",
                        "x-taskplane-tenant": "bench", "x-taskplane-session-id": session, "x-taskplane-task-id": session})
    request_body = pb.HttpBody(body=json.dumps(body).encode(), end_of_stream=True)
    request = ([_as_attributes(headers, request_body)] if stream else
               [pb.ProcessingRequest(request_headers=headers), pb.ProcessingRequest(request_body=request_body)])
    answer_bytes = json.dumps(answer).encode()

    def response(served: str) -> list[pb.ProcessingRequest]:
        if stream:
            return []
        attrs = struct_pb2.Struct()
        attrs.update({"upstream.address": served})
        return [pb.ProcessingRequest(response_headers=_headers({":status": "200", "content-type": "application/json"}),
                                     attributes={"envoy.filters.http.ext_proc": attrs}),
                pb.ProcessingRequest(response_body=pb.HttpBody(body=answer_bytes, end_of_stream=True))]

    return request, response


def _wire(messages: list[pb.ProcessingRequest]) -> list[bytes]:
    return [m.SerializeToString() for m in messages]


def _parsed(wire: list[bytes]) -> list[pb.ProcessingRequest]:
    """What the picker's gRPC server hands it: each message parsed from its bytes."""
    return [pb.ProcessingRequest.FromString(b) for b in wire]


async def _stream(queue: asyncio.Queue[pb.ProcessingRequest | None]) -> AsyncIterator[pb.ProcessingRequest]:
    while (m := await queue.get()) is not None:
        yield m


class _Context:
    """The gRPC context's one part the picker reads: which taskplane filter opened the stream."""

    def __init__(self, exchange: str | None) -> None:
        self._metadata = ((EXCHANGE_HEADER, exchange),) if exchange else ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


def log_message(key: str, served: str) -> als.StreamAccessLogsMessage:
    """Envoy's access-log message for one stream served whole by ``served`` (``ip:port``),
    with the Lua filter's findings, as the picker's access-log service receives it."""
    entry = al.HTTPAccessLogEntry()
    common = entry.common_properties
    fill_struct(common.metadata.filter_metadata[TP_NAMESPACE], {
        "call": key, "stream": True, "hide_usage": True, "first_token_ms": time.time() * 1000.0, "events": 16,
        "prompt_tokens": 200, "completion_tokens": 16, "cached_tokens": 128, "done": True, "ended": True})
    host, _, port = served.rpartition(":")
    common.upstream_remote_address.socket_address.address = host
    common.upstream_remote_address.socket_address.port_value = int(port)
    common.upstream_request_attempt_count = 1
    common.start_time.GetCurrentTime()
    common.time_to_first_upstream_tx_byte.FromMilliseconds(1)
    msg = als.StreamAccessLogsMessage()
    msg.http_logs.log_entry.append(entry)
    return msg


async def _one(message: als.StreamAccessLogsMessage) -> AsyncIterator[als.StreamAccessLogsMessage]:
    yield message


class JournalingSink(AttemptSink):
    """A row sink that journals attempts as the cost writer does (each note built and queued
    for a group commit) and stores nothing: the picker's work per call as with a database."""

    async def open_attempt(self, attempt_key: str, note: str) -> None:
        return None

    def open_attempt_soon(self, attempt_key: str, note: str) -> asyncio.Future[None]:
        queued: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queued.set_result(None)  # committed at once: the group commit (one per batch of notes) is left out
        return queued


async def measure(replicas: int, calls: int, stream: bool = False) -> dict[str, Any]:
    """Unary calls as a GIE-style Envoy sends them (four messages each), or ``stream``:
    streamed calls as taskplane's Envoy sends them (one message, the body with the request
    headers as attributes), each settled from its access-log entry."""
    config = fleet_config(replicas)
    registry = ReplicaRegistry(config)
    for s in registry.replicas.values():
        s.kv_blocks_total, s.block_size = 8192, 16
    placer = build_placer(config, registry)
    service = CallService(config, registry, placer, JournalingSink(), GatewayMetrics())
    book = EndpointBook(registry)
    book.refresh()
    streams = StreamBook()
    picker = Picker(service, book, streams)
    logs = AccessLogs(streams, picker.replica_at)
    context = _Context("route" if stream else None)
    placed: dict[str, int] = {}
    per_call: list[float] = []
    requests = [_wire(exchange(i, stream)[0]) for i in range(calls)]
    respond = exchange(0, stream)[1]
    responses = {ep: _wire(respond(ep)) for ep in book.by_endpoint}
    envoys_work = 0.0
    t0 = time.process_time()
    wall0 = time.perf_counter()
    for i in range(calls):
        c0 = time.perf_counter()
        queue: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()
        for m in _parsed(requests[i]):
            queue.put_nowait(m)
        first = key = ""
        async for resp in picker.Process(_stream(queue), context):
            _wire_out(resp)
            if resp.HasField("request_body"):
                first = next(h.header.raw_value.decode().split(",")[0] for h in resp.request_body.response.header_mutation.set_headers
                             if h.header.key == "x-gateway-destination-endpoint")
                key = resp.dynamic_metadata.fields[TP_NAMESPACE].struct_value.fields["call"].string_value
                placed[first] = placed.get(first, 0) + 1
                for m in _parsed(responses[first]):
                    queue.put_nowait(m)
                queue.put_nowait(None)
            elif resp.HasField("immediate_response"):
                queue.put_nowait(None)
        if stream and key:  # the stream's access-log entry, parsed from its bytes as gRPC would
            envoy0 = time.process_time()
            wire = log_message(key, first).SerializeToString()
            envoys_work += time.process_time() - envoy0  # building the entry is Envoy's work, not the picker's
            await logs.StreamAccessLogs(_one(als.StreamAccessLogsMessage.FromString(wire)), None)
        per_call.append(time.perf_counter() - c0)
    cpu = time.process_time() - t0 - envoys_work
    wall = time.perf_counter() - wall0
    xs = sorted(per_call)
    return {"replicas": replicas, "calls": calls, "decisions_per_cpu_s": round(calls / cpu, 1),
            "decisions_per_s": round(calls / wall, 1), "cpu_us_per_call": round(cpu * 1e6 / calls, 1),
            "call_us_p50": round(xs[len(xs) // 2] * 1e6, 1), "call_us_p99": round(xs[int(len(xs) * 0.99)] * 1e6, 1),
            "mean_us": round(statistics.fmean(xs) * 1e6, 1), "replicas_used": len(placed), "messages": 1 if stream else 4,
            "settled_from_log": logs.entries, "left_in_book": streams.waiting,
            "rows": {o: int(service.metrics.cost_rows.labels(outcome=o)._value.get()) for o in ("success", "error", "shed")}}


def _wire_out(resp: pb.ProcessingResponse) -> bytes:
    return resp.SerializeToString()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.picker_decisions", description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=256)
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--stream", action="store_true",
                   help="streamed calls as taskplane's Envoy sends them (one message: the body, the request headers "
                        "as attributes), each settled from its access-log entry, instead of unary GIE-style ones")
    p.add_argument("--stream-messages", type=int, choices=(1,), default=None,
                   help="the same as --stream (taskplane's Envoy sends one message per streamed call)")
    args = p.parse_args(argv)
    configure_logging("warning")
    print(json.dumps(asyncio.run(measure(args.replicas, args.calls, args.stream or args.stream_messages == 1)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
