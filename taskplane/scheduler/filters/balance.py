"""Load balance as a filter: affinity weighed against load, the way SGLang's router does it.

The prefix and session scorers pull a fleet's new work toward the replica that already
holds the shared system prompt: with nothing else in the way, ten concurrent tasks on
three replicas put 109 of 117 calls on one replica and none on the third. When the fleet
is imbalanced (SGLang's two thresholds: the most loaded replica is ``abs_threshold`` above
the least loaded *and* ``rel_threshold`` times it), this filter keeps only the replicas
within ``abs_threshold`` of the least loaded, so affinity decides among them alone; in a
balanced fleet it keeps everyone and affinity decides as before.

Load is what SGLang counts, requests, extended to sessions: the larger of the calls still
to come of the sessions pinned to a replica (each pin's steps remaining plus one, paused
sessions included: their next steps come back to it) and the calls it runs or queues (all
a plain client without a session leaves behind). The relative
threshold keeps a large fleet's small differences out; the absolute one keeps a small
fleet's first few tasks on the shared prompt's replica.

Neither scales with the fleet: among 16 replicas running ~10 calls each, chance alone leaves
the most loaded at 1.5x the least, and "within 2 of the least loaded" keeps a handful of
them, away from the session's prefix and from the replicas the latency scorer would pick
(Mooncake, 16 x H100: TTFT p50 252 ms with the filter, 168 without). So in a fleet of at
least ``chance_min_replicas`` the filter also asks that the most loaded replica be above what
random placement of the same load would leave there: the expected maximum of n Poisson
counts, mean + sqrt(2 ln n * mean), times ``chance_k``. A pile-up (affinity pulling new work
onto one replica) is far above it; chance spread is not. When it trips, only the replicas
above that bound leave the choice (``keep: below-chance``): keeping just those near the
least loaded, as a small fleet does, sent new sessions to a handful of replicas by request
count while their prefill queues differed by seconds (Mooncake, 16 x H100, host 256 GB:
TTFT p50 151 -> 122 ms, p99 5,074 -> 4,779 ms, with ``chance_k`` 1.0 instead of 1.5).
Smaller fleets keep the two
thresholds alone: on 4 replicas the chance rule cost the agents bench 1-2 points of tasks
within deadline. Only new work is balanced (a call
that opens a task, or a plain call): a later step of a session stays with its context,
whose re-prefill would cost more than the imbalance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Filter, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState


@dataclass(slots=True)
class LoadBalanceParams:
    abs_threshold: float = param(
        2.0, "imbalance when the most loaded replica's load (calls to come or in flight) exceeds the least loaded's by more than this"
    )
    rel_threshold: float = param(1.5, "... and is at least this multiple of it (SGLang's balance_rel_threshold)")
    chance_k: float = param(
        1.0, "in a fleet of at least chance_min_replicas: ... and exceeds the fleet's mean load by more than this "
        "many times the spread chance alone gives n replicas (sqrt(2 ln n x mean)); 0: no such condition"
    )
    chance_min_replicas: int = param(
        8, "fleets (replicas able to take the call) smaller than this balance by the two thresholds alone"
    )
    keep: str = param(
        "below-chance",
        "in a fleet balanced by chance: which replicas a pile-up leaves to affinity: 'below-chance' (every "
        "replica at or below chance's maximum: only the piled-up ones are taken out) or 'near-least' "
        "(within abs_threshold of the least loaded, as smaller fleets)",
    )
    keep_warm_adapter: bool = param(
        True, "a call with a LoRA adapter also keeps the replicas (able to take it) where its adapter runs or "
        "waits: moving it off them costs an adapter load, often more than the imbalance saves",
    )

    def validate(self) -> None:
        if self.abs_threshold < 0 or self.rel_threshold < 1 or self.chance_k < 0 or self.chance_min_replicas < 2:
            raise ValueError("abs_threshold and chance_k must be >= 0, rel_threshold >= 1, chance_min_replicas >= 2")
        if self.keep not in ("below-chance", "near-least"):
            raise ValueError("keep must be 'below-chance' or 'near-least'")


def replica_load(state: CycleState) -> np.ndarray:
    """Per pool replica: calls to come of the sessions pinned there, or calls running and
    queued, the larger."""
    calls = state.running + state.waiting
    pins = state.handle.sessions
    if pins is None:
        return calls
    pins.sweep(state.now_s)
    return np.maximum(calls, pins.work_of_rows(state.table, state.rows))


def chance_high(loads: np.ndarray, k: float) -> float:
    """The most loaded of ``len(loads)`` replicas as random placement of the same load
    would leave it, plus margin: mean + k * sqrt(2 ln n * mean) (the expected maximum of n
    Poisson counts, normal approximation)."""
    mean = float(loads.mean())
    return mean + k * math.sqrt(2.0 * math.log(len(loads)) * mean)


@register("load-balance")
class LoadBalanceFilter(Filter):
    """Keeps only the replicas near the least loaded while the fleet is imbalanced."""

    Params = LoadBalanceParams

    def filter(self, state: CycleState) -> np.ndarray | None:
        p: LoadBalanceParams = self.params
        if not state.starts_task:
            return None  # a later step's context is where it ran: balance only places new work
        load = state.c(replica_load(state))
        # only replicas that can take the call now count: steering new work to an idle
        # replica without working-set room (or a full batch) would only hold it
        able = ~state.c(state.saturated)
        if len(load) < 2 or int(np.count_nonzero(able)) < 2:
            return None
        loads = load[able]
        low, high = float(loads.min()), float(loads.max())
        if high - low <= p.abs_threshold or high < p.rel_threshold * low:
            return None  # balanced enough: affinity decides
        if p.chance_k and len(loads) >= p.chance_min_replicas:
            ceiling = chance_high(loads, p.chance_k)
            if high <= ceiling:
                return None  # no more spread than random placement would give: nothing piles up
            if p.keep == "below-chance":
                return self._with_warm_adapter(state, able, able & (load <= ceiling))
        return self._with_warm_adapter(state, able, able & (load <= low + p.abs_threshold))

    def _with_warm_adapter(self, state: CycleState, able: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """``keep`` plus, for a call with an adapter, the able replicas where it runs or waits."""
        adapter = state.request.adapter
        if not adapter or not self.params.keep_warm_adapter:
            return keep
        warm = np.fromiter((adapter in (v := state.view(int(i))).lora_running or adapter in v.lora_waiting
                            for i in state.sel), dtype=bool, count=len(state.sel))
        return keep | (able & warm)

    def keeps(self, one: OneCandidate) -> bool:
        return True  # the pinned replica of a session: see the module docstring
