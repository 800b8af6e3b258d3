"""vLLM's sleep mode on a real ``taskplane sim-engine`` process over HTTP: the endpoints'
shapes, the KV drop (AllBlocksCleared, nothing cached after the wake), calls held while
asleep, /health as vLLM answers it, and the sleep-state gauge the gateway reads."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from taskplane.engines.metrics import parse_metrics
from taskplane.scheduler.kv.events import AllBlocksCleared, BlockStored
from taskplane.sim.gpus import default_cold_start_s
from taskplane.sim.sleep import sleep_seconds, wake_seconds

from .conftest import SimProc
from .test_kv_events import Collector, _chat, _msgs, _subscribe

SPEED = 10.0


def _gauge(text: str, state: str) -> float:
    for line in text.splitlines():
        if line.startswith("vllm:engine_sleep_state{") and f'sleep_state="{state}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sleep_state={state} sample")


def test_modelled_times_hot_start_is_seconds_and_beats_a_cold_start() -> None:
    cold = default_cold_start_s("h100", "llama-3.1-8b")
    l1, l2 = wake_seconds("h100", "llama-3.1-8b", 1), wake_seconds("h100", "llama-3.1-8b", 2)
    assert 1.0 < l1 < 2.0 and l1 < l2 < cold
    assert sleep_seconds("h100", "llama-3.1-8b", 1) > sleep_seconds("h100", "llama-3.1-8b", 2)


async def test_level1_sleep_drops_the_kv_and_wake_restores_service(sim_factory: Any) -> None:
    sim: SimProc = sim_factory("--enable-sleep-mode", speed=SPEED)
    col = Collector()
    sub = await _subscribe(sim, col)
    msgs = _msgs("Fix the failing test.")
    try:
        async with httpx.AsyncClient(timeout=30) as c:
            await _chat(c, sim, msgs)
            await col.wait_for(lambda: bool(col.of(BlockStored)))
            assert (await c.get(f"{sim.url}/is_sleeping")).json() == {"is_sleeping": False}
            assert _gauge((await c.get(f"{sim.url}/metrics")).text, "awake") == 1.0
            r = await c.post(f"{sim.url}/sleep", params={"level": 1})
            assert r.status_code == 200 and r.json() == {"status": "sleeping", "level": 1}
            await col.wait_for(lambda: bool(col.of(AllBlocksCleared)))
            assert (await c.get(f"{sim.url}/is_sleeping")).json() == {"is_sleeping": True}
            assert (await c.get(f"{sim.url}/health")).status_code == 200  # as vLLM: only a dead engine fails it
            page = (await c.get(f"{sim.url}/metrics")).text
            assert _gauge(page, "awake") == 0.0 and _gauge(page, "weights_offloaded") == 1.0
            snap = parse_metrics(page)
            assert snap.sleeping and snap.kv_cache_usage == 0.0
            state = (await c.get(f"{sim.url}/admin/state")).json()
            assert state["cached_blocks"] == 0 and state["sleep"]["asleep"] == ["kv_cache", "weights"]

            # a call while asleep waits (vLLM queues it), and is served after the wake
            held = asyncio.create_task(_chat(c, sim, msgs))
            await asyncio.sleep(0.3)
            assert not held.done()
            t0 = time.monotonic()
            woke = await c.post(f"{sim.url}/wake_up")
            wake_wall = time.monotonic() - t0
            assert woke.json() == {"status": "awake", "tags": None}
            assert wake_wall >= wake_seconds("h100", "llama-3.1-8b", 1) / SPEED * 0.9
            body = await asyncio.wait_for(held, 10)
            assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the KV was dropped
            assert not parse_metrics((await c.get(f"{sim.url}/metrics")).text).sleeping
    finally:
        await sub.stop()


async def test_partial_wake_by_tags_and_level2(sim_factory: Any) -> None:
    sim: SimProc = sim_factory("--enable-sleep-mode", speed=50.0)
    async with httpx.AsyncClient(timeout=30) as c:
        assert (await c.post(f"{sim.url}/sleep", params={"level": 2})).json()["level"] == 2
        assert _gauge((await c.get(f"{sim.url}/metrics")).text, "discard_all") == 1.0
        r = await c.post(f"{sim.url}/wake_up", params={"tags": "weights"})
        assert r.json() == {"status": "sleeping", "tags": ["weights"]}
        assert (await c.get(f"{sim.url}/is_sleeping")).json()["is_sleeping"] is True
        r = await c.post(f"{sim.url}/wake_up", params={"tags": "kv_cache"})
        assert r.json() == {"status": "awake", "tags": ["kv_cache"]}
        assert (await c.get(f"{sim.url}/is_sleeping")).json()["is_sleeping"] is False
        await _chat(c, sim, _msgs("hello"))
        assert (await c.post(f"{sim.url}/sleep", params={"level": 3})).status_code == 422


async def test_sleep_aborts_calls_in_flight_unless_mode_wait(sim_factory: Any) -> None:
    sim: SimProc = sim_factory("--enable-sleep-mode", speed=1.0)
    body = {"model": sim.model, "messages": _msgs("long answer"), "max_tokens": 400}
    async with httpx.AsyncClient(timeout=60) as c:
        call = asyncio.create_task(c.post(f"{sim.url}/v1/chat/completions", json=body))
        await asyncio.sleep(0.3)
        assert (await c.post(f"{sim.url}/sleep", params={"level": 1, "mode": "wait"})).status_code == 200
        assert (await call).status_code == 200  # it finished before the replica slept
        await c.post(f"{sim.url}/wake_up")
        call = asyncio.create_task(c.post(f"{sim.url}/v1/chat/completions", json=body))
        await asyncio.sleep(0.3)
        await c.post(f"{sim.url}/sleep", params={"level": 1})
        r = await call
        assert r.status_code == 500 and "sleep" in r.text


async def test_without_the_flag_there_are_no_sleep_endpoints_and_the_gauge_says_awake(sim: SimProc) -> None:
    async with httpx.AsyncClient(timeout=10) as c:
        assert (await c.post(f"{sim.url}/sleep")).status_code == 404
        assert _gauge((await c.get(f"{sim.url}/metrics")).text, "awake") == 1.0


async def test_level0_pauses_without_dropping_the_cache(sim_factory: Any) -> None:
    sim: SimProc = sim_factory("--enable-sleep-mode", speed=50.0)
    msgs = _msgs("keep the cache")
    async with httpx.AsyncClient(timeout=30) as c:
        await _chat(c, sim, msgs)
        await c.post(f"{sim.url}/sleep", params={"level": 0})
        assert (await c.get(f"{sim.url}/is_sleeping")).json()["is_sleeping"] is True
        assert (await c.post(f"{sim.url}/wake_up", params={"tags": "scheduling"})).json()["status"] == "awake"
        again = await _chat(c, sim, msgs)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
