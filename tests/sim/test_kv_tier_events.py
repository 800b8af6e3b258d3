"""Host-tier KV events over a real ZMQ publisher / subscriber pair into the scheduler's KV
index: the ``medium`` of offloaded blocks must survive every shape the events arrive in
(vLLM's typed structs, and plain maps as any other consumer or publisher hands them on)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import numpy as np

from taskplane.engines.kv_events import KVEventSubscriber
from taskplane.scheduler.hashing import chain_hashes
from taskplane.scheduler.policies import build_policy
from taskplane.sim.engine import EngineConfig, KVEvents, SimEngine, SimRequest
from taskplane.sim.publisher import KVEventPublisher
from tests.sim.conftest import free_port_pair
from tests.sim.test_engine_model import drive
from tests.sim.test_hosttier import _tiers

TOKENS = list(range(1024))  # 64 blocks of 16
OTHER = list(range(5000, 6024))


def engine_batches() -> list[list[Any]]:
    """A GPU of 100 blocks with a host tier: prompt a, then prompt b evicts a from the GPU
    (its host copy stays); the engine's KV event batches, GPU and CPU medium."""
    e = SimEngine(EngineConfig(gpu="h100", kv_blocks=100, block_size=16), tiers=_tiers(1000))
    ev = drive(e, [(0.0, SimRequest("a", 1024, 8, chain_hashes(TOKENS, 16), token_ids=TOKENS)),
                   (5.0, SimRequest("b", 1024, 8, chain_hashes(OTHER, 16), token_ids=OTHER))])
    return [x.events for x in ev if isinstance(x, KVEvents)]


def depths(policy: Any) -> tuple[float, float]:
    """(GPU prefix, GPU + host prefix) of prompt a on r0, in blocks, from the policy's index."""
    index = policy.kv_index
    hs = chain_hashes(TOKENS, 16)
    rid = index.slots.ids_of(["r0"])
    gpu = index.match_ids(hs, rid).astype(np.float64)
    return float(gpu[0]), float(index.precise.tiers.depths(hs, rid, gpu)[0])


async def relay(batches: list[list[Any]], *, as_plain_data: bool) -> tuple[float, float]:
    """Publish ``batches`` on a real ZMQ PUB, subscribe with the live subscriber and feed a
    taskplane policy; ``as_plain_data``: the subscriber's consumer hands the events on as
    plain maps (``msgspec.to_builtins``), the shape the index's normaliser takes."""
    port, replay = free_port_pair()
    pub = KVEventPublisher("127.0.0.1", port, replay_port=replay)
    pub.start()
    policy = build_policy("taskplane", metrics=False)
    got = asyncio.Event()
    n_batches = 0

    def on_events(replica: str, events: list[Any]) -> None:
        nonlocal n_batches
        policy.on_kv_events(replica, msgspec.to_builtins(events) if as_plain_data else events)
        n_batches += 1
        if n_batches == len(batches):
            got.set()

    sub = KVEventSubscriber("r0", f"tcp://127.0.0.1:{port}", on_events,
                            replay_endpoint=f"tcp://127.0.0.1:{replay}", replay_from=0)
    await sub.start()
    try:
        await asyncio.sleep(0.3)  # the SUB subscription reaches the publisher
        for i, b in enumerate(batches):
            pub.publish(float(i), b)
        await asyncio.wait_for(got.wait(), 10.0)
    finally:
        await sub.stop()
        await pub.close()
    return depths(policy)


async def test_host_tier_events_reach_the_index_over_zmq_as_structs_and_as_plain_maps() -> None:
    batches = engine_batches()
    assert {getattr(x, "medium", None) for b in batches for x in b} >= {"GPU", "CPU"}
    for plain in (False, True):
        gpu, deep = await relay(batches, as_plain_data=plain)
        assert gpu < 64, plain  # prompt a left the GPU ...
        assert deep == 64, plain  # ... and its host copy, announced with medium CPU, covers it


def test_plain_map_host_events_store_and_evict_like_the_typed_ones() -> None:
    batches = engine_batches()
    typed = build_policy("taskplane", metrics=False)
    plain = build_policy("taskplane", metrics=False)
    for b in batches:
        typed.on_kv_events("r0", b)
        plain.on_kv_events("r0", msgspec.to_builtins(b))
    assert depths(plain) == depths(typed)
    host = plain.kv_index.precise.tiers
    rid = int(plain.kv_index.slots.ids_of(["r0"])[0])
    held = host.blocks_of(rid)
    assert held == typed.kv_index.precise.tiers.blocks_of(rid) and held
    cpu_hashes = [h for b in batches for x in msgspec.to_builtins(b)
                  if x["type"] == "BlockStored" and x["medium"] == "CPU" for h in x["block_hashes"]]
    plain.on_kv_events("r0", [{"type": "BlockRemoved", "block_hashes": cpu_hashes, "medium": "CPU"}])
    assert host.blocks_of(rid) == set()
    assert depths(plain)[1] == depths(plain)[0]  # no host blocks: the match is the GPU's alone
