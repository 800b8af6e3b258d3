"""A pool scaled to zero (``hold_when_empty_s``): a call is held, not refused, until a
replica joins or comes back healthy, and is then placed at once; with none, 503 after the
hold. The placer and registry are the gateway's own (built from config as `taskplane
gateway` builds them); the recovery case scrapes a real simulated replica."""

from __future__ import annotations

import asyncio

from tp_sim_replica import sim_replica

from taskplane.calls.placement import ScheduledPlacer
from taskplane.calls.wiring import build_placer
from taskplane.config import GatewayConfig, ReplicaConfig
from taskplane.engines.registry import ReplicaRegistry
from taskplane.scheduler.types import Action, CallRequest

MODEL = "llama-3.1-8b"


def _config(hold_s: float, *urls: str) -> GatewayConfig:
    return GatewayConfig.model_validate({
        "auth": False,
        "pools": [{"model": MODEL, "hold_when_empty_s": hold_s,
                   "replicas": [{"url": u, "name": f"r{i}"} for i, u in enumerate(urls)]}],
    })


def _held(placer: ScheduledPlacer) -> int:
    return sum(n for bands in placer.queue_depths().values() for n in bands.values())


def _call() -> CallRequest:
    return CallRequest(model=MODEL, prompt_tokens=64, max_tokens=8, session_id="s1", task_id="t1")


async def test_a_call_held_for_an_empty_pool_is_placed_when_a_replica_joins() -> None:
    config = _config(30.0)
    registry = ReplicaRegistry(config)
    placer = build_placer(config, registry)
    held = asyncio.create_task(placer.place(_call(), exclude=set()))
    await asyncio.sleep(0.2)
    assert not held.done(), "an empty pool with a hold must hold the call, not refuse it"
    assert _held(placer) == 1  # what the autoscaler reads as demand
    registry.add(config.pools[0], ReplicaConfig(url="http://127.0.0.1:9", name="woken"))
    decision = await asyncio.wait_for(held, timeout=5.0)  # woken by the join, long before the 30 s hold
    assert (decision.action, decision.replica) == (Action.PLACE, "woken")
    assert _held(placer) == 0


async def test_a_held_call_gets_no_replica_when_none_comes_up_in_time() -> None:
    config = _config(0.3)
    placer = build_placer(config, ReplicaRegistry(config))
    decision = await asyncio.wait_for(placer.place(_call(), exclude=set()), timeout=5.0)
    assert decision.action is Action.NO_REPLICA and "came up within" in decision.reason
    assert _held(placer) == 0


async def test_a_held_call_is_placed_when_a_down_replica_answers_its_scrape_again() -> None:
    async with sim_replica() as url:
        config = _config(30.0, url)
        registry = ReplicaRegistry(config)
        placer = build_placer(config, registry)
        await registry.start()
        registry.replicas["r0"].healthy = False  # as a failed scrape leaves it
        held = asyncio.create_task(placer.place(_call(), exclude=set()))
        await asyncio.sleep(0.2)
        assert not held.done()
        await registry.scrape(registry.replicas["r0"])  # it answers: healthy again
        decision = await asyncio.wait_for(held, timeout=5.0)
        await registry.close()
        assert (decision.action, decision.replica) == (Action.PLACE, "r0")
