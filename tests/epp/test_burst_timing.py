"""Issue 19: where a stream's first token waits, as the picker reports it. Streams go
through the real front door (Envoy, the picker, simulated replicas); the picker's timing
histograms (``taskplane.epp.timing``) must then hold one observation per stream: its
decision, its routing message's share of it, and Envoy's clock per logged call; read back
as ``gateway_load`` reads them (``taskplane.bench.picker_timing``)."""

from __future__ import annotations

import asyncio
import re
import uuid

import httpx
from tp_epp_helpers import chat, tp_headers

from taskplane.bench import picker_timing
from taskplane.dev.local import LocalCluster
from taskplane.epp.timing import PHASES


async def test_each_stream_is_timed_from_its_first_message_to_its_first_token(door: LocalCluster) -> None:
    task = f"timed-{uuid.uuid4().hex[:8]}"
    before = await picker_timing.read(door.gateway_url)
    async with httpx.AsyncClient(base_url=door.gateway_url, timeout=30) as client:

        async def one(step: int) -> str:
            async with client.stream("POST", "/v1/chat/completions", json=chat(f"step {step}", stream=True),
                                     headers=tp_headers(task, step)) as r:
                assert r.status_code == 200
                return "".join([line async for line in r.aiter_lines()])

        bodies = await asyncio.gather(*(one(i) for i in range(6)))
    assert all("[DONE]" in b for b in bodies)
    figures: dict[str, dict[str, float]] = {}
    for _ in range(50):  # the access-log entries follow within Envoy's 50 ms flush
        figures = picker_timing.phase_figures(before, await picker_timing.read(door.gateway_url))
        if all(figures.get(p, {}).get("n") == 6 for p in PHASES):
            break
        await asyncio.sleep(0.1)
    assert figures["decision"]["n"] == 6 and figures["route"]["n"] == 6
    assert figures["route"]["mean"] <= figures["decision"]["mean"]  # the routing message's share of the decision
    assert figures["reply_wait"]["n"] >= 6  # the headers' reply and the routing answer, per stream
    for phase in PHASES:
        assert figures[phase]["n"] == 6, (phase, figures)
    # Envoy's first token comes after its request was routed
    assert figures["first_token"]["mean"] >= figures["routed"]["mean"]


async def test_the_front_door_freezes_what_start_up_built(door: LocalCluster) -> None:
    """A full collection walked start-up's objects and stopped the loop 80-250 ms in a
    burst; once Envoy is up the front door freezes them (``taskplane.epp.gcfreeze``)."""
    async with httpx.AsyncClient(base_url=door.gateway_url, timeout=30) as client:
        text = (await client.get("/metrics")).text
    found = re.search(r"^taskplane_epp_gc_frozen_objects ([0-9.e+]+)$", text, re.M)
    assert found is not None
    assert float(found.group(1)) > 10_000
