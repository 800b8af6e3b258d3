"""The one-candidate fast lane (a pinned session's call) must compute exactly what the
array path computes over a pool of that one replica."""

from __future__ import annotations

import random

import numpy as np
from _sched_util import engine_store_events, replica, request, tokens

from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Filter
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.policies import build_scheduler
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.tenants import TenantPolicy
from taskplane.scheduler.types import CallOutcome


def _case(rng: random.Random) -> tuple[object, ...]:
    filters = None
    if rng.random() < 0.5:  # hard filters, another metric
        filters = [
            "healthy",
            "tenant-gpu",
            {"type": "memory-headroom", "params": {"soft": False, "min_free_ratio": 1.5}},
            {"type": "latency-budget", "params": {"soft": False, "metric": "ttft", "slack": 0.8}},
        ]
    tenants = [TenantPolicy("t", excluded_gpus=frozenset({"l40s"}))]
    sched = build_scheduler(policy="taskplane", filters=filters, tenants=tenants, metrics=False)
    toks = tokens(rng.randrange(3), rng.randrange(1, 40))
    views = [
        replica(
            f"r{i}",
            gpu=rng.choice(["h100", "a100", "l40s"]),
            kv_blocks_total=rng.choice([0, 50, 400, 2000]),
            kv_blocks_free=rng.randrange(0, 400),
            num_running=rng.randrange(0, 300),
            num_waiting=rng.randrange(0, 4),
            inflight_prefill_tokens=rng.randrange(0, 9000),
            max_num_seqs=rng.choice([0, 64, 256]),
            block_size=rng.choice([0, 16]),
            healthy=rng.random() < 0.9,
            model_loaded=rng.random() < 0.8,
        )
        for i in range(3)
    ]
    table = ReplicaTable(views)
    if rng.random() < 0.7:
        events, _ = engine_store_events(toks[: rng.randrange(0, len(toks) + 1)])
        sched.on_kv_events("r1", events)
    if rng.random() < 0.5:  # recalibrated latency model
        sched.observe_completion(
            request(call_id="x"), CallOutcome("r1", gpu="h100", prompt_tokens=900, completion_tokens=80,
                                              ttft_s=0.3, total_s=2.0), 1.0)
    assert sched.sessions is not None
    for s in range(rng.randrange(0, 4)):  # other sessions' working sets on r1
        sched.sessions.placed(f"o{s}", "r1", 0.0, tokens=rng.randrange(0, 40_000))
    req = request(
        toks,
        max_tokens=rng.randrange(1, 400),
        step=rng.choice([None, 0, 3]),
        steps_remaining=rng.choice([None, 0, 5]),
        budget_ms=rng.choice([None, 100.0, 5_000.0, 90_000.0]),
        priority=rng.choice(["critical", "standard", "batch"]),
        tenant="t",
        session_id="s",
    )
    return sched, table, req


def test_one_candidate_matches_the_array_path() -> None:
    rng = random.Random(7)
    for _ in range(300):
        sched, table, req = _case(rng)
        one = OneCandidate(sched.pipeline.handle, req, table, 1, 2.0)  # type: ignore[attr-defined]
        state = CycleState(sched.pipeline.handle, req, table, np.array([1], dtype=np.intp), 2.0, "m")  # type: ignore[attr-defined]
        state._pinned = 0
        assert one.matched() == float(state.matched()[0])
        assert one.new_blocks_needed() == float(state.new_blocks_needed()[0])
        assert one.uncached_tokens() == float(state.uncached_tokens()[0])
        pred, arr = one.prediction, state.prediction
        for field in ("queue_ms", "prefill_ms", "decode_ms", "ttft_ms", "total_ms", "empty_total_ms"):
            assert getattr(pred, field) == float(getattr(arr, field)[0]), field
        assert one.saturated == bool(state.saturated[0])
        room = state.room
        assert one.room == (None if room is None else bool(room[0]))
        for f in sched.pipeline.filters:  # type: ignore[attr-defined]
            keep = f.filter(state)
            assert f.keeps(one) == (keep is None or bool(keep[0])), f.name
            assert Filter.keeps(f, one) == f.keeps(one), f.name  # the generic fallback agrees
