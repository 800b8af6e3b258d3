"""Weight warmth across base models (axis 4): when a replica hosting a call's model asleep may
swap to it.

The swap's wait is in the prediction already (:mod:`taskplane.scheduler.swapcost`), so among
the replicas this filter keeps the scorers prefer the cheapest swap; the filter adds what a
price cannot say. A warm replica wins whenever one can take the call now within its budget.
When none can (every warm replica saturated or predicted past the budget), a swap pays where
it moves capacity from a model with slack: the replica's awake model is awake elsewhere with
room to spare (none of its other replicas saturated) or has had no call for ``idle_s``, its
live sessions pin little of its KV cache (a swap loses their context: they would prefill it
again elsewhere), and it did not swap in the last ``hold_s`` (no flapping). A model with no warm replica
at all may swap any replica hosting it: that is the only way to serve it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.demand import ModelDemand
from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Filter, Stateful, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.table import COL, ReplicaTable
from taskplane.scheduler.types import Decision, ReplicaView
from taskplane.scheduler.workflow import call_budget_ms


@dataclass(slots=True)
class SwapGateParams:
    idle_s: float = param(30.0, "a model with no call for this long has no demand: its last awake replica may swap")
    hold_s: float = param(60.0, "a replica that swapped stays on its model at least this long (no flapping)")
    free_kv: float = param(0.2, "an awake replica has room to spare with at least this share of its KV blocks free")
    max_pinned: float = param(0.5, "no swap of a replica whose live sessions pin more than this share of its KV "
                                    "(they would lose their context and prefill it again elsewhere)")


@register("swap-gate")
class SwapGateFilter(Filter, Stateful):
    """Drops replicas hosting the call's model asleep unless a swap pays (see the module docstring)."""

    Params = SwapGateParams

    def __init__(self, params: SwapGateParams, **kw: object) -> None:
        super().__init__(params, **kw)  # type: ignore[arg-type]
        self.demand = ModelDemand()
        self.swapped: dict[str, float] = {}  # replica -> when a call was placed there for a swap
        self.since: float | None = None  # the first decision seen: demand is known from then on

    def keeps(self, one: OneCandidate) -> bool:
        self.demand.saw(one.request.model, one.request.call_id, one.now_s)
        return True  # a session's pinned replica serves its model awake (the pin requires it)

    def placed(self, state: CycleState | OneCandidate, view: ReplicaView, decision: Decision) -> None:
        if view.model != state.model:
            self.swapped[view.name] = state.now_s

    def filter(self, state: CycleState) -> np.ndarray | None:
        now = state.now_s
        self.demand.saw(state.model, state.request.call_id, now)
        if self.since is None:
            self.since = now
        if state.asleep is None:
            return None
        asleep = state.c(state.asleep)
        warm = ~asleep
        if not asleep.any() or not warm.any():
            return None
        budget = call_budget_ms(state.request)
        serves = warm & ~state.c(state.busy)
        if budget is not None:
            serves &= state.c(state.prediction.total_ms) <= budget
        if serves.any():
            return warm
        return warm | (asleep & self._spare(state))

    def _spare(self, state: CycleState) -> np.ndarray:
        """Per candidate: its awake model may lose it, and it has not swapped lately."""
        p: SwapGateParams = self.params
        now, table = state.now_s, state.table
        watched = self.since is not None and now - self.since >= p.idle_s
        slack = models_with_slack(table, p.free_kv, state.saturation_waiting)
        pins = state.handle.sessions
        pinned = (pins.working_sets_of_rows(table, state.rows) if pins is not None else np.zeros(state.n))
        light = pinned <= p.max_pinned * state.total * state.block_size
        out = np.zeros(len(state.sel), dtype=bool)
        for k, i in enumerate(state.sel):
            view = state.view(int(i))
            if not light[i] or now - self.swapped.get(view.name, -np.inf) < p.hold_s:
                continue
            idle = watched and self.demand.last_call.get(view.model, -np.inf) < now - p.idle_s
            out[k] = idle or slack.get(view.model, 0) > 1
        return out


def models_with_slack(table: ReplicaTable, free_kv: float, max_waiting: int) -> dict[str, int]:
    """Per model: its healthy awake replicas, counted only when none of them is short of room
    (engine queue at ``max_waiting``, a full batch, or less than ``free_kv`` of its KV free);
    a model with a replica short of room counts 0 (it has no replica to spare)."""
    cols = table.cols
    out: dict[str, int] = {}
    for r, v in enumerate(table.views):
        if not v.healthy or v.role == "prefill":
            continue
        row = cols[r]
        short = (row[COL["num_waiting"]] >= max_waiting or row[COL["num_running"]] >= row[COL["max_num_seqs"]]
                 or row[COL["kv_blocks_free"]] < free_kv * max(row[COL["kv_blocks_total"]], 1.0))
        n = out.get(v.model, 0)
        out[v.model] = -len(table) if short else (n + 1 if n >= 0 else n)
    return {m: max(n, 0) for m, n in out.items()}
