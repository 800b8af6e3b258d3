"""Capacity moved between base models by a swap instead of a cold start (autoscale/swaps.py)."""

from __future__ import annotations

from typing import Any

from taskplane.autoscale.swaps import Swap, plan_swaps
from taskplane.autoscale.types import Generation, Phase, Plan, PoolSignals, ReplicaState

A, B = "model-a", "model-b"
GEN = Generation("h100", 2.5, cold_start_s=18.0, capacity_per_s=100.0)


def _speed(_s: PoolSignals, _gpu: str) -> float:
    return GEN.capacity_per_s


def _pools(a_replicas: list[ReplicaState]) -> dict[str, PoolSignals]:
    return {A: PoolSignals(A, 0.0, a_replicas, [GEN]),
            B: PoolSignals(B, 0.0, [ReplicaState("b0", "h100")], [GEN])}


def _rep(name: str, **kw: Any) -> ReplicaState:
    return ReplicaState(name, "h100", phase=Phase.READY, models_asleep=frozenset({B}), **kw)


def test_a_start_becomes_a_swap_of_the_idlest_replica_of_a_pool_with_spare_capacity() -> None:
    signals = _pools([_rep("a0", num_running=4), _rep("a1", num_running=1), _rep("a2", num_running=2)])
    plans = {A: Plan(A, desired=3), B: Plan(B, desired=2, start=["h100"])}
    swaps = plan_swaps(plans, signals, {A: 150.0, B: 200.0}, _speed)  # A needs 1.5 of its 3 replicas
    assert swaps == [Swap("a1", A, B)]
    assert plans[B].start == [] and plans[A].desired == 2


def test_no_swap_when_the_pool_needs_its_replicas_or_they_pin_sessions() -> None:
    signals = _pools([_rep("a0"), _rep("a1")])
    plans = {A: Plan(A, desired=2), B: Plan(B, desired=2, start=["h100"])}
    assert plan_swaps(plans, signals, {A: 150.0}, _speed) == [] and plans[B].start == ["h100"]
    signals = _pools([_rep("a0", live_sessions=3), _rep("a1", live_sessions=1), _rep("a2", live_sessions=2)])
    assert plan_swaps(plans, signals, {A: 50.0}, _speed) == [] and plans[B].start == ["h100"]


def test_only_replicas_hosting_the_model_asleep_can_swap() -> None:
    signals = _pools([ReplicaState("a0", "h100"), ReplicaState("a1", "h100")])
    plans = {A: Plan(A, desired=2), B: Plan(B, desired=2, start=["h100", "h100"])}
    assert plan_swaps(plans, signals, {A: 0.0}, _speed) == []
