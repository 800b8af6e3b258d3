"""Prefix caching, KV events over ZMQ, eviction, replay and resync against a real sim process."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx

from taskplane.engines.kv_events import KVEventSubscriber
from taskplane.engines.metrics import parse_metrics
from taskplane.engines.tokenize import chat_tokens
from taskplane.scheduler.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

from .conftest import SimProc

SYSTEM = "You are a meticulous agent that fixes bugs. Think step by step. " * 5


def _msgs(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


class Collector:
    def __init__(self) -> None:
        self.events: list[KVEvent] = []
        self.resyncs = 0
        self.changed = asyncio.Event()

    def on_events(self, replica: str, events: list[KVEvent]) -> None:
        assert replica == "r0"
        self.events.extend(events)
        self.changed.set()

    def on_resync(self, replica: str) -> None:
        self.resyncs += 1

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    async def wait_for(self, pred: Any, timeout: float = 10.0) -> None:
        async def loop() -> None:
            while not pred():
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(loop(), timeout)


async def _subscribe(sim: SimProc, col: Collector) -> KVEventSubscriber:
    sub = KVEventSubscriber("r0", sim.kv_endpoint, col.on_events, replay_endpoint=sim.replay_endpoint,
                            on_resync=col.on_resync, replay_from=0)
    await sub.start()
    await asyncio.sleep(0.3)  # let the SUB subscription reach the publisher
    return sub


async def _chat(client: httpx.AsyncClient, sim: SimProc, msgs: list[dict[str, str]], n: int = 8) -> dict[str, Any]:
    r = await client.post(f"{sim.url}/v1/chat/completions",
                          json={"model": sim.model, "messages": msgs, "max_tokens": n, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


async def test_shared_prefix_raises_prefix_cache_hits_by_the_shared_blocks(sim: SimProc) -> None:
    a, b = _msgs("Fix the failing test in parser.py."), _msgs("Now explain what the loop does.")
    ta, tb = chat_tokens(a), chat_tokens(b)
    shared = next(i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y)
    async with httpx.AsyncClient(timeout=30) as client:
        await _chat(client, sim, a)
        before = parse_metrics((await client.get(f"{sim.url}/metrics")).text)
        second = await _chat(client, sim, b)
        after = parse_metrics((await client.get(f"{sim.url}/metrics")).text)
    expect = (shared // 16) * 16
    assert expect >= 16 * 10
    assert after.prefix_cache_hits - before.prefix_cache_hits == expect
    assert after.prefix_cache_queries - before.prefix_cache_queries == len(tb)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == expect


async def test_subscriber_decodes_block_stored_with_tokens_and_chain(sim: SimProc) -> None:
    col = Collector()
    sub = await _subscribe(sim, col)
    try:
        msgs = _msgs("List the files.")
        async with httpx.AsyncClient(timeout=30) as client:
            body = await _chat(client, sim, msgs, n=40)
        total = body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
        await col.wait_for(lambda: sum(len(e.block_hashes) for e in col.of(BlockStored)) >= total // 16)
    finally:
        await sub.stop()
    stored = col.of(BlockStored)
    hashes = [h for e in stored for h in e.block_hashes]
    assert len(hashes) == total // 16 and len(set(hashes)) == len(hashes)
    assert stored[0].parent_block_hash is None
    for prev, nxt in itertools.pairwise(stored):
        assert nxt.parent_block_hash == prev.block_hashes[-1]
    tokens = [t for e in stored for t in e.token_ids]
    prompt = chat_tokens(msgs)
    assert tokens[: len(prompt) // 16 * 16] == prompt[: len(prompt) // 16 * 16]
    assert all(e.block_size == 16 and e.medium == "GPU" for e in stored)
    assert sub.stats["resyncs"] == 0


async def test_scheduler_kv_index_reads_the_sim_events(sim: SimProc) -> None:
    """The gateway's KV index, fed by this stream, finds the prompt's blocks on the replica."""
    from taskplane.scheduler.hashing import chain_hashes
    from taskplane.scheduler.kvindex import PreciseIndex, ReplicaSlots

    col = Collector()
    sub = await _subscribe(sim, col)
    msgs = _msgs("Refactor the module.")
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            await _chat(client, sim, msgs)
        n_blocks = len(chat_tokens(msgs)) // 16
        await col.wait_for(lambda: sum(len(e.block_hashes) for e in col.of(BlockStored)) >= n_blocks)
    finally:
        await sub.stop()
    slots = ReplicaSlots()
    index = PreciseIndex(slots)
    index.apply_events("r0", col.events)
    ours = chain_hashes(chat_tokens(msgs), 16)
    assert set(ours) <= index.blocks_of("r0")


async def test_eviction_publishes_block_removed(sim_factory: Any) -> None:
    sim = sim_factory("--kv-blocks", "24")
    col = Collector()
    sub = await _subscribe(sim, col)
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            first = [{"role": "user", "content": "alpha " * 40}]
            second = [{"role": "user", "content": "omega " * 40}]
            await _chat(client, sim, first)
            # every batch the first call produced (prompt blocks, then output blocks) has arrived
            published = (await client.get(f"{sim.url}/admin/state")).json()["kv_events"]["next_seq"]
            await col.wait_for(lambda: sub.last_seq is not None and sub.last_seq + 1 >= published)
            stored_first = {h for e in col.of(BlockStored) for h in e.block_hashes}
            await _chat(client, sim, second)
            await col.wait_for(lambda: bool(col.of(BlockRemoved)))
    finally:
        await sub.stop()
    removed = [h for e in col.of(BlockRemoved) for h in e.block_hashes]
    assert removed and set(removed) <= stored_first
    assert all(len(e.block_hashes) == 1 for e in col.of(BlockRemoved))  # one per block, as vLLM


async def test_dropped_events_are_recovered_by_replay(sim: SimProc) -> None:
    col = Collector()
    sub = await _subscribe(sim, col)
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            await _chat(client, sim, _msgs("one"))
            await col.wait_for(lambda: bool(col.of(BlockStored)))
            n_before = len(col.of(BlockStored))
            r = await client.post(f"{sim.url}/admin/faults", json={"drop_events": True})
            assert r.json()["drop_events"] == 1.0
            await _chat(client, sim, _msgs("two, with events lost on the wire"))
            await _chat(client, sim, _msgs("three, also lost"))
            state = (await client.get(f"{sim.url}/admin/state")).json()
            assert state["kv_events"]["dropped"] >= 2
            assert len(col.of(BlockStored)) == n_before  # nothing arrived
            await client.post(f"{sim.url}/admin/faults", json={"clear": True})
            await _chat(client, sim, _msgs("four"))
            expected = state["kv_events"]["next_seq"] + 1
            await col.wait_for(lambda: sub.last_seq is not None and sub.last_seq + 1 >= expected)
    finally:
        await sub.stop()
    assert sub.stats["gaps"] == 1 and sub.stats["replayed"] >= 2 and sub.stats["resyncs"] == 0
    assert col.resyncs == 0
    assert len(col.of(BlockStored)) >= n_before + 3


async def test_restart_empty_clears_cache_and_forces_resync(sim: SimProc) -> None:
    col = Collector()
    sub = await _subscribe(sim, col)
    msgs = _msgs("Run the tests again.")
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            await _chat(client, sim, msgs)
            assert (await _chat(client, sim, msgs))["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            await col.wait_for(lambda: bool(col.of(BlockStored)))
            r = await client.post(f"{sim.url}/admin/faults", json={"restart_empty": True})
            assert r.status_code == 200 and r.json()["actions"] == ["restart_empty"]
            await col.wait_for(lambda: bool(col.of(AllBlocksCleared)))
            again = await _chat(client, sim, msgs)
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            state = (await client.get(f"{sim.url}/admin/state")).json()
    finally:
        await sub.stop()
    assert col.resyncs == 1  # the sequence started again at 0
    assert state["stats"]["prefix_hits"] > 0
