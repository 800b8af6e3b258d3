"""Capacity between base models sharing a fleet: a swap instead of a cold start.

Each pool (one base model; pools are named by their model) is planned on its own by
:class:`~taskplane.autoscale.planner.TaskplaneAutoscaler`. When one pool's plan would start
new replicas while another pool has capacity to spare on replicas that host the first
pool's model asleep, a swap (the replica's awake engine sleeps, the other wakes: seconds,
and no new GPU paid for) adds the capacity cheaper than a cold start (tens of seconds, and
a GPU more by the hour). :func:`plan_swaps` turns those starts into swaps.

A replica may move only when its pool still covers its own demand without it (the
planner's ``last_demand`` against its other replicas' capacity), and when it is ready with
no live session pinned there (a swap discards the KV cache: those sessions would re-prefill
their context elsewhere). Among those, the one with the least in flight moves first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from taskplane.autoscale.types import Phase, Plan, PoolSignals, ReplicaState


@dataclass(frozen=True, slots=True)
class Swap:
    """Move ``replica`` from ``from_pool``'s model to ``to_pool``'s (sleep one engine, wake the other)."""

    replica: str
    from_pool: str
    to_pool: str


def plan_swaps(plans: dict[str, Plan], signals: dict[str, PoolSignals], demand: dict[str, float],
               speed: Callable[[PoolSignals, str], float]) -> list[Swap]:
    """Swaps that replace starts in ``plans`` (changed in place: a replaced start is removed
    from the receiving plan, the moved replica counts out of its pool's ``desired``).

    ``demand``: each pool's planned need (work units/s, the planner's ``last_demand``);
    ``speed(signals, gpu)``: one replica's capacity in that pool."""
    spare = {pool: sum(speed(s, r.gpu) for r in s.active()) - demand.get(pool, 0.0) for pool, s in signals.items()}
    moved: set[str] = set()
    swaps: list[Swap] = []
    for to_pool, plan in plans.items():
        while plan.start:
            pick = _candidate(to_pool, signals, spare, moved, speed)
            if pick is None:
                break
            from_pool, r = pick
            plan.start.pop()
            spare[from_pool] -= speed(signals[from_pool], r.gpu)
            moved.add(r.name)
            if from_pool in plans:
                plans[from_pool].desired -= 1
            swaps.append(Swap(r.name, from_pool, to_pool))
            plan.reasons.append(f"swap {r.name} from {from_pool} instead of a cold start")
    return swaps


def _candidate(to_pool: str, signals: dict[str, PoolSignals], spare: dict[str, float], moved: set[str],
               speed: Callable[[PoolSignals, str], float]) -> tuple[str, ReplicaState] | None:
    """The idlest ready replica hosting ``to_pool``'s model asleep whose pool can spare it."""
    best: tuple[tuple[int, str], str, ReplicaState] | None = None
    for from_pool, s in signals.items():
        if from_pool == to_pool:
            continue
        for r in s.replicas:
            if (r.phase is not Phase.READY or to_pool not in r.models_asleep or r.live_sessions or r.name in moved
                    or speed(s, r.gpu) > spare[from_pool] + 1e-9):
                continue
            key = (r.inflight, r.name)
            if best is None or key < best[0]:
                best = (key, from_pool, r)
    return None if best is None else (best[1], best[2])
