"""Decisions first (issue 19): while a routing decision is under way, a logged stream's
rows wait, but what placement and admission count (its lease, its tenant's slot) is given
back the moment its access-log entry comes. Drives the real Picker and access-log service
with the messages Envoy sends (``taskplane.epp.decisions``), over a real registry."""

from __future__ import annotations

import asyncio

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from taskplane.engines.registry import ReplicaRegistry
from taskplane.epp.accesslog import AccessLogs
from taskplane.epp.book import StreamBook
from taskplane.epp.decisions import _Context, _one, _stream, exchange, fleet_config, log_message
from taskplane.epp.endpoints import EndpointBook
from taskplane.epp.envoy_config import TP_NAMESPACE
from taskplane.epp.server import Picker
from taskplane.epp.timing import BurstTiming, DecisionsFirst
from taskplane.gateway.attempts import AttemptSink
from taskplane.gateway.metrics import GatewayMetrics
from taskplane.gateway.service import Gateway
from taskplane.gateway.wiring import build_placer
from taskplane.store.records import AttemptRecord, Stored


class Rows(AttemptSink):
    """The attempt rows as the cost writer would take them, kept in order."""

    def __init__(self) -> None:
        self.rows: list[AttemptRecord] = []

    async def record_attempt(self, rec: AttemptRecord) -> Stored | None:
        self.rows.append(rec)
        return Stored.OUTBOX


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.mark.parametrize("deferred", [True, False])
async def test_rows_wait_for_a_decision_but_the_lease_is_back_at_once(deferred: bool) -> None:
    config = fleet_config(2)
    registry = ReplicaRegistry(config)
    for s in registry.replicas.values():
        s.kv_blocks_total, s.block_size = 8192, 16
    metrics, rows = GatewayMetrics(), Rows()
    gw = Gateway(config, registry, build_placer(config, registry), rows, metrics)
    book = EndpointBook(registry)
    book.refresh()
    streams = StreamBook()
    first = DecisionsFirst(max_defer_s=30.0) if deferred else None
    timing = BurstTiming(metrics.registry, first)
    picker = Picker(gw, book, streams, timing)
    logs = AccessLogs(streams, picker.replica_at, timing)
    try:
        # call A is routed (two messages) and streams: it waits for its log entry
        queue_a: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()
        for m in exchange(0, stream=True)[0]:
            queue_a.put_nowait(m)
        queue_a.put_nowait(None)
        answer = [r async for r in picker.Process(_stream(queue_a), _Context("route"))][-1]
        key = answer.dynamic_metadata.fields[TP_NAMESPACE].struct_value.fields["call"].string_value
        endpoint = next(h.header.raw_value.decode().split(",")[0] for h in answer.request_body.response.header_mutation.set_headers
                        if h.header.key == "x-gateway-destination-endpoint")
        served = registry.replicas[book.replica(endpoint) or ""]
        assert served.inflight == 1 and gw.lifecycle.tenant_inflight("bench") == 1

        # call B's request headers came: its decision is under way
        queue_b: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()
        request_b = exchange(1, stream=True)[0]
        queue_b.put_nowait(request_b[0])
        b = asyncio.ensure_future(_drain(picker, queue_b))
        await _turns()
        assert timing.first is None or timing.first.pending == 1

        # A's access-log entry comes meanwhile
        logged = asyncio.ensure_future(logs.StreamAccessLogs(_one(log_message(key, endpoint)), None))
        await _turns()
        assert served.inflight == 0, "the finished stream's lease must be back at once"
        assert gw.lifecycle.tenant_inflight("bench") == 0  # A's slot came back with its entry (B takes one with its body)
        success = [r for r in rows.rows if r.outcome.value == "success"]
        assert (len(success) == 0) is deferred  # deferred: A's row waits for B's decision

        # B's body: its routing answer leaves, and A's row is written
        queue_b.put_nowait(request_b[1])
        queue_b.put_nowait(None)
        await asyncio.wait_for(logged, 5.0)
        await asyncio.wait_for(b, 5.0)
        success = [r for r in rows.rows if r.outcome.value == "success"]
        assert len(success) == 1 and success[0].replica == served.name
        assert success[0].total_ms is not None and success[0].total_ms < 5_000
        count = next(x.value for x in timing.decision.collect()[0].samples if x.name.endswith("_count"))
        assert count == 2  # both decisions timed
        assert timing.first is None or timing.first.pending == 0
    finally:
        await gw.close()


async def _drain(picker: Picker, queue: asyncio.Queue[pb.ProcessingRequest | None]) -> list[pb.ProcessingResponse]:
    return [r async for r in picker.Process(_stream(queue), _Context("route"))]
