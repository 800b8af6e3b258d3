"""Latency budget (axis 6) as a filter: keep replicas predicted to finish within budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from taskplane.scheduler.framework.normalise import keeps_all
from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Filter, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.workflow import call_budget_ms


@dataclass(slots=True)
class LatencyBudgetParams:
    metric: Literal["total", "ttft"] = param("total", "compare the budget with predicted total time or time to first token")
    slack: float = param(1.0, "a replica passes when predicted time <= budget * slack")
    soft: bool = param(
        True, "when no replica meets the budget keep them all (admission decides: move, shed or 504)"
    )


@register("latency-budget")
class LatencyBudgetFilter(Filter):
    """Drops replicas predicted to miss the call's share of the deadline budget (the task's
    remaining budget spread over this and the remaining steps) while others meet it."""

    Params = LatencyBudgetParams

    def filter(self, state: CycleState) -> np.ndarray | None:
        budget = call_budget_ms(state.request)
        if budget is None:
            return None
        p: LatencyBudgetParams = self.params
        pred = state.prediction
        times = pred.total_ms if p.metric == "total" else pred.ttft_ms
        ok = state.c(times) <= budget * p.slack
        return None if keeps_all(ok, p.soft) else ok

    def keeps(self, one: OneCandidate) -> bool:
        budget = call_budget_ms(one.request)
        if budget is None:
            return True
        p: LatencyBudgetParams = self.params
        pred = one.prediction
        times = pred.total_ms if p.metric == "total" else pred.ttft_ms
        return times <= budget * p.slack or p.soft  # soft never empties the pool
