"""One test (or a few) per filter, scorer and picker, on a real Scheduler's cycle state."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _sched_util import BS, engine_store_events, fleet, replica, request, tokens

from taskplane.scheduler.core import Scheduler
from taskplane.scheduler.flowcontrol.controller import FlowControl
from taskplane.scheduler.framework.plugin import Kind
from taskplane.scheduler.framework.registry import REGISTRY
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.policies import build_scheduler
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.tenants import TenantPolicy
from taskplane.scheduler.types import CallRequest, ReplicaView


def make_state(pool: list[ReplicaView], req: CallRequest, sched: Scheduler | FlowControl | None = None) -> CycleState:
    sched = sched or Scheduler(name="t", metrics=False)
    table = ReplicaTable(pool)
    handle = sched.pipeline.handle if isinstance(sched, FlowControl) else sched.handle
    return CycleState(handle, req, table, table.pool(req.model), 0.0, req.model)


def kept(type_name: str, pool: list[ReplicaView], req: CallRequest, params: dict[str, Any] | None = None,
         sched: Scheduler | FlowControl | None = None) -> list[str]:
    f = REGISTRY.build(Kind.FILTER, {"type": type_name, "params": params or {}})
    state = make_state(pool, req, sched)
    mask = f.filter(state)  # type: ignore[attr-defined]
    if mask is not None:
        state.narrow(mask)
    return [pool[i].name for i in state.sel]


def scores(type_name: str, pool: list[ReplicaView], req: CallRequest, params: dict[str, Any] | None = None,
           sched: Scheduler | FlowControl | None = None) -> dict[str, float]:
    s = REGISTRY.build(Kind.SCORER, {"type": type_name, "params": params or {}})
    state = make_state(pool, req, sched)
    out = s.score(state)  # type: ignore[attr-defined]
    assert out.shape == (len(pool),)
    assert np.all((out >= 0) & (out <= 1)), out
    return {r.name: round(float(v), 6) for r, v in zip(pool, out, strict=True)}


# ------------------------------------------------------------------ filters


def test_healthy_filter() -> None:
    pool = [replica("a"), replica("b", healthy=False)]
    assert kept("healthy", pool, request()) == ["a"]


def test_tenant_gpu_filter() -> None:
    sched = Scheduler(name="t", metrics=False, tenants=[TenantPolicy("acme", excluded_gpus=frozenset({"l40s"}))])
    pool = [replica("a", gpu="l40s"), replica("b", gpu="h100")]
    assert kept("tenant-gpu", pool, request(tenant="acme"), sched=sched) == ["b"]
    assert kept("tenant-gpu", pool, request(tenant="other"), sched=sched) == ["a", "b"]


def test_memory_headroom_filter_is_soft() -> None:
    req = request(tokens(1, 10), max_tokens=160)  # 10 prompt + 10 completion blocks
    pool = [replica("a", kv_blocks_free=5), replica("b", kv_blocks_free=50)]
    assert kept("memory-headroom", pool, req) == ["b"]
    tight = [replica("a", kv_blocks_free=5), replica("b", kv_blocks_free=6)]
    assert kept("memory-headroom", tight, req) == ["a", "b"]
    assert kept("memory-headroom", tight, req, {"soft": False}) == []


def test_latency_budget_filter() -> None:
    pool = [replica("fast", gpu="h100"), replica("slow", gpu="cpu")]
    req = request(tokens(1, 64), budget_ms=3000.0)
    assert kept("latency-budget", pool, req) == ["fast"]
    assert kept("latency-budget", pool, request(tokens(1, 64))) == ["fast", "slow"]  # no budget
    # nobody meets 1 ms: soft keeps both so admission can decide
    assert kept("latency-budget", pool, request(tokens(1, 64), budget_ms=1.0)) == ["fast", "slow"]


def _queued(loads: list[int]) -> list[ReplicaView]:
    return [replica(f"r{i}", num_running=n) for i, n in enumerate(loads)]


def test_load_balance_filter_trips_on_a_pile_up_not_on_chance_spread() -> None:
    new_task = request(task_id="t", session_id="t", step=0)
    # 16 replicas running 6-14 calls each: what random placement of ~10 a replica leaves
    # (mean 10, chance bound 10 + 1.0 * sqrt(2 ln 16 * 10) = 17.4): everyone stays
    spread = [6, 14, 9, 11, 10, 8, 12, 10, 9, 11, 13, 7, 10, 10, 9, 11]
    assert len(kept("load-balance", _queued(spread), new_task)) == 16
    # SGLang's two thresholds alone keep only the replicas within 2 of the least loaded
    assert kept("load-balance", _queued(spread), new_task, {"chance_k": 0}) == ["r0", "r5", "r11"]
    # one replica far above its share (bound 12.1 + 8.2 = 20.3): only it leaves affinity's choice
    piled = [40, *spread[1:]]
    assert kept("load-balance", _queued(piled), new_task) == [f"r{i}" for i in range(1, 16)]
    # ... or, with keep near-least, new work goes to the least loaded alone
    assert kept("load-balance", _queued(piled), new_task, {"keep": "near-least"}) == ["r2", "r5", "r8", "r11", "r14"]
    # a replica above chance's bound but below the pile-up leaves too
    assert kept("load-balance", _queued([40, 21, *spread[2:]]), new_task) == [f"r{i}" for i in range(2, 16)]
    # a small fleet balances by the two thresholds alone, as before
    assert kept("load-balance", _queued([6, 14, 9, 11]), new_task) == ["r0"]
    # a later step of a session is never balanced
    assert len(kept("load-balance", _queued(piled), request(task_id="t", session_id="t", step=3))) == 16


# ------------------------------------------------------------------ scorers


def test_prefix_cache_scorer_precise_and_approximate() -> None:
    sched = Scheduler(name="t", metrics=False)
    toks = tokens(1, 8)
    events, _ = engine_store_events(toks[: 6 * BS])
    sched.kv_index.apply_events("a", events)
    req = request(toks)
    sched.kv_index.record_routing("b", req.block_hashes[:4], 100)
    pool = [replica("a"), replica("b"), replica("c")]
    assert scores("prefix-cache", pool, req, sched=sched) == {"a": 0.75, "b": 0.5, "c": 0.0}
    assert scores("prefix-cache", pool, req, {"source": "precise"}, sched=sched) == {"a": 0.75, "b": 0.0, "c": 0.0}
    assert scores("prefix-cache", pool, req, {"source": "approximate"}, sched=sched)["a"] == 0.0


def test_session_affinity_scorer() -> None:
    sched = build_scheduler(policy="taskplane", metrics=False)
    assert sched.sessions is not None
    sched.sessions.placed("s1", "b", 0.0)
    pool = fleet(3)
    req = request(session_id="s1")
    assert scores("session-affinity", pool, req, sched=sched) == {"r0": 0.0, "r1": 0.0, "r2": 0.0}
    pool = [replica("a"), replica("b"), replica("c")]
    assert scores("session-affinity", pool, req, sched=sched) == {"a": 0.0, "b": 1.0, "c": 0.0}
    busy = [replica("a"), replica("b", num_waiting=5), replica("c")]
    assert scores("session-affinity", busy, req, sched=sched)["b"] == 0.0
    assert scores("session-affinity", busy, req, {"break_when_saturated": False}, sched=sched)["b"] == 1.0


def test_queue_kv_usage_and_least_loaded_scorers() -> None:
    pool = [
        replica("a", num_waiting=0, num_running=10, kv_blocks_free=900),
        replica("b", num_waiting=4, num_running=0, kv_blocks_free=250),
        replica("c", num_waiting=8, num_running=2, kv_blocks_free=1000),
    ]
    req = request()
    assert scores("queue", pool, req) == {"a": 1.0, "b": 0.5, "c": 0.0}
    assert scores("kv-usage", pool, req) == {"a": 0.9, "b": 0.25, "c": 1.0}
    assert scores("least-loaded", pool, req) == {"a": 0.0, "b": 1.0, "c": 0.0}
    same = [replica("a"), replica("b")]
    assert scores("queue", same, req) == {"a": 1.0, "b": 1.0}


def test_latency_scorer_prefers_cache_and_speed() -> None:
    sched = Scheduler(name="t", metrics=False)
    toks = tokens(1, 200)
    sched.kv_index.apply_events("warm", engine_store_events(toks)[0])
    pool = [replica("warm"), replica("cold"), replica("slowgpu", gpu="l40s"), replica("busy", num_waiting=6)]
    s = scores("latency", pool, request(toks), sched=sched)
    assert s["warm"] == 1.0
    assert s["warm"] > s["cold"] > s["slowgpu"]
    assert s["cold"] > s["busy"]


def test_memory_headroom_scorer() -> None:
    req = request(tokens(1, 10), max_tokens=160)  # 20 blocks needed
    pool = [replica("a", kv_blocks_free=1000), replica("b", kv_blocks_free=520), replica("c", kv_blocks_free=10)]
    assert scores("memory-headroom", pool, req) == {"a": 0.98, "b": 0.5, "c": 0.0}


def test_weight_warmth_scorer() -> None:
    pool = [replica("a"), replica("b", model_loaded=False)]
    assert scores("weight-warmth", pool, request()) == {"a": 1.0, "b": 0.0}


def test_gpu_price_scorer_cheapest_that_meets_budget() -> None:
    pool = [
        replica("h100", gpu="h100", cost_per_hour_usd=2.5),
        replica("l40s", gpu="l40s", cost_per_hour_usd=0.9),
    ]
    loose = scores("gpu-price", pool, request(tokens(1, 64), budget_ms=60_000.0))
    assert loose["l40s"] == 1.0 and loose["h100"] < 1.0
    tight = scores("gpu-price", pool, request(tokens(1, 64), budget_ms=1_000.0, max_tokens=64))
    assert tight == {"h100": 1.0, "l40s": 0.0}  # the cheap GPU would miss the budget
    hourly = scores("gpu-price", pool, request(), {"per_call": False})
    assert hourly == {"h100": round(0.9 / 2.5, 6), "l40s": 1.0}


def test_workflow_context_scorer() -> None:
    pool = [
        replica("fast", gpu="b200", cost_per_hour_usd=6.0),
        replica("cheap", gpu="l40s", cost_per_hour_usd=0.9),
    ]
    fresh = scores("workflow-context", pool, request(tokens(1, 64), step=0, steps_remaining=9))
    assert fresh == {"fast": 1.0, "cheap": 1.0}  # nothing at stake: neutral
    late = scores(
        "workflow-context", pool,
        request(tokens(1, 64), step=9, steps_remaining=1, sunk_cost_usd=2.0),
    )
    assert late["fast"] > late["cheap"]


def test_dynamo_cost_scorer() -> None:
    sched = Scheduler(name="t", metrics=False)
    toks = tokens(1, 20)
    sched.kv_index.apply_events("warm", engine_store_events(toks)[0])
    pool = [
        replica("warm", kv_blocks_free=900),  # 100 active blocks, 0 to prefill
        replica("idle", kv_blocks_free=1000),  # 0 active, 20 to prefill
        replica("busy", kv_blocks_free=500),  # 500 active, 20 to prefill
    ]
    s = scores("dynamo-cost", pool, request(toks), sched=sched)
    # costs: warm 0+100+20=120, idle 20+0+20=40, busy 20+500+20=540
    assert s["idle"] == 1.0 and s["busy"] == 0.0
    assert s["warm"] == pytest.approx(1 - 80 / 500)


# ------------------------------------------------------------------ pickers


def picks(policy: str, pool: list[ReplicaView], reqs: list[CallRequest], seed: int = 0) -> list[str | None]:
    s = build_scheduler(policy=policy, seed=seed, metrics=False)
    return [s.decide(r, pool, 0.0).replica for r in reqs]


def test_max_score_ties_are_seeded() -> None:
    pool = fleet(8)
    reqs = [request() for _ in range(40)]
    a = picks("least-loaded", pool, reqs, seed=1)
    assert a == picks("least-loaded", pool, reqs, seed=1)
    assert a != picks("least-loaded", pool, reqs, seed=2)
    assert len(set(a)) > 4  # ties spread, not always the first replica


def test_round_robin_cycles_and_skips_filtered() -> None:
    pool = fleet(3)
    assert picks("round-robin", pool, [request() for _ in range(4)]) == ["r0", "r1", "r2", "r0"]
    pool[1] = replica("r1", healthy=False)
    assert picks("round-robin", pool, [request() for _ in range(4)]) == ["r0", "r2", "r0", "r2"]


def test_consistent_hash_moves_only_the_departed_replicas_sessions() -> None:
    s = build_scheduler(policy="session-hash", metrics=False)
    pool = fleet(8)
    sessions = [f"s{i}" for i in range(200)]
    before = {x: s.decide(request(session_id=x), pool, 0.0).replica for x in sessions}
    assert len(set(before.values())) == 8
    assert before == {x: s.decide(request(session_id=x), pool, 0.0).replica for x in sessions}
    smaller = [r for r in pool if r.name != "r3"]
    after = {x: s.decide(request(session_id=x), smaller, 0.0).replica for x in sessions}
    for x in sessions:
        if before[x] != "r3":
            assert after[x] == before[x]
        else:
            assert after[x] != "r3"
    # an unhealthy replica is skipped the same way
    sick = [replica(r.name, healthy=r.name != "r3") for r in pool]
    assert {x: s.decide(request(session_id=x), sick, 0.0).replica for x in sessions} == after


def test_sglang_rule() -> None:
    s = build_scheduler(policy="sglang-cache-aware", metrics=False)
    toks = tokens(1, 10)
    req = request(toks)
    s.kv_index.record_routing("cached", req.block_hashes[:5], 1000)  # ratio 0.5 > 0.3
    balanced = [replica("cached", num_running=10), replica("idle", num_running=2)]
    assert s.decide(req, balanced, 0.0).replica == "cached"
    # imbalance: max - min > 64 and max > 1.5 x min -> shortest queue wins over the cache
    imbalanced = [replica("cached", num_running=100), replica("idle", num_running=20)]
    assert s.decide(request(toks), imbalanced, 0.0).replica == "idle"
    # a weak match (2 of 10 blocks = 0.2 <= 0.3) goes to the least loaded
    s2 = build_scheduler(policy="sglang-cache-aware", metrics=False)
    s2.kv_index.record_routing("cached", req.block_hashes[:2], 1000)
    assert s2.decide(request(toks), balanced, 0.0).replica == "idle"


def test_latency_scorer_with_budget_only_cares_inside_the_budget() -> None:
    pool = [replica("fast", gpu="b200"), replica("slow", gpu="l40s"), replica("jammed", num_waiting=40)]
    aware = {"budget_aware": True}
    roomy = scores("latency", pool, request(tokens(1, 8), max_tokens=32, budget_ms=600_000.0), aware)
    assert roomy["fast"] == roomy["slow"] == 1.0  # both comfortably inside: price may decide
    tight = scores("latency", pool, request(tokens(1, 8), max_tokens=32, budget_ms=1_000.0), aware)
    assert tight["fast"] == 1.0 and 0.0 < tight["slow"] < 1.0 and tight["jammed"] == 0.0
    # the budget is the task's: a call with 3 steps after it gets a quarter of it
    shared = scores("latency", pool, request(tokens(1, 8), max_tokens=32, budget_ms=4_000.0, steps_remaining=3), aware)
    assert shared == tight
    default = scores("latency", pool, request(tokens(1, 8), max_tokens=32, budget_ms=600_000.0))
    assert default["fast"] == 1.0 and default["slow"] < 0.5
