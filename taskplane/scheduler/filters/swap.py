"""Weight warmth across base models (axis 4): when a replica hosting a call's model asleep may
swap to it.

The swap's wait is in the prediction already (:mod:`taskplane.scheduler.swapcost`); this
filter adds what a price cannot say: a warm replica always wins when one can take the call
now within its budget, and a swap must not take away the last awake replica of a model
still in demand. Demand is what the filter has seen: the last call of each model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Filter, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.workflow import call_budget_ms


@dataclass(slots=True)
class SwapGateParams:
    idle_s: float = param(30.0, "a model with no call for this long has no demand: its last awake replica may swap")


@register("swap-gate")
class SwapGateFilter(Filter):
    """Drops replicas hosting the call's model asleep while a warm one can take the call
    within budget; otherwise keeps those predicted to finish it sooner than any warm one,
    swap included, whose awake model can spare them (it is awake elsewhere too, or has had
    no call for ``idle_s``). With no warm replica at all, every
    replica hosting the model stays (a swap is the only way to serve it)."""

    Params = SwapGateParams

    def __init__(self, params: SwapGateParams, **kw: object) -> None:
        super().__init__(params, **kw)  # type: ignore[arg-type]
        self.last_call: dict[str, float] = {}  # model -> when its last call was decided

    def keeps(self, one: OneCandidate) -> bool:
        self.last_call[one.request.model] = one.now_s
        return True  # a session's pinned replica serves its model awake (the pin requires it)

    def filter(self, state: CycleState) -> np.ndarray | None:
        self.last_call[state.model] = state.now_s
        if state.asleep is None:
            return None
        asleep = state.c(state.asleep)
        if not asleep.any():
            return None
        warm = ~asleep
        if not warm.any():
            return None
        budget = call_budget_ms(state.request)
        total = state.c(state.prediction.total_ms)
        serves = warm & ~state.c(state.busy)
        if budget is not None:
            serves &= total <= budget
        if serves.any():
            return warm
        # a swap pays when it beats every warm replica's own wait (their queue ahead included)
        pays = asleep & (total < float(total[warm].min()))
        return warm | (pays & self._spare(state))

    def _spare(self, state: CycleState) -> np.ndarray:
        """Per candidate: its awake model may lose it (awake elsewhere, or no recent demand)."""
        table = state.table
        idle_before = state.now_s - self.params.idle_s
        out = np.zeros(len(state.sel), dtype=bool)
        for k, i in enumerate(state.sel):
            awake = state.view(int(i)).model
            if self.last_call.get(awake, -np.inf) < idle_before:
                out[k] = True
                continue
            others = sum(1 for r in table.pool(awake) if table.views[r].model == awake and table.views[r].healthy)
            out[k] = others > 1
        return out
