"""Memory headroom (axis 2), weight warmth (axis 4) and predicted latency (axis 6)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from taskplane.scheduler.framework.normalise import ratio_low_is_better
from taskplane.scheduler.framework.plugin import Scorer, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.workflow import call_budget_ms


@register("memory-headroom")
class MemoryHeadroomScorer(Scorer):
    """Free KV blocks left after this call, as a fraction of the replica's KV blocks.

    Keeps headroom for the sessions already living on a replica: a call that would push
    it into evicting their blocks scores 0.
    """

    def score(self, state: CycleState) -> np.ndarray:
        left = state.c((state.free - state.new_blocks_needed()) / state.total)  # one restriction, not three
        return left.clip(0.0, 1.0)


@register("weight-warmth")
class WeightWarmthScorer(Scorer):
    """1 when the model's weights are loaded, 0 when placing here costs a cold start."""

    def score(self, state: CycleState) -> np.ndarray:
        return state.c(state.loaded).astype(np.float64)


@dataclass(slots=True)
class LatencyParams:
    metric: Literal["total", "ttft"] = param(
        "total", "rank by predicted total time (queue + prefill of the uncached suffix + decode) or TTFT"
    )
    budget_aware: bool = param(
        False,
        "with a deadline budget, score against this call's share of it (flat while comfortably inside) "
        "instead of relative to the fastest replica; off by default: in simulation always preferring "
        "the faster replica gave lower TTFT and lower cost",
    )
    budget_comfort: float = param(
        0.5,
        "with a deadline budget, replicas predicted within budget x this all score 1 (speed beyond "
        "that buys nothing, so price can decide); the score falls linearly to 0 at the budget",
    )

    def validate(self) -> None:
        if not 0.0 < self.budget_comfort <= 1.0:
            raise ValueError("budget_comfort must be in (0, 1]")


@register("latency")
class LatencyScorer(Scorer):
    """Predicted time on each replica, from live load and the self-calibrating GPU model.

    Default: best predicted time / this replica's (1 for the fastest). With
    ``budget_aware`` and a budget (this call's share of the task's remaining budget): 1
    while comfortably inside it, falling to 0 at the budget.
    """

    Params = LatencyParams

    def score(self, state: CycleState) -> np.ndarray:
        p: LatencyParams = self.params
        budget = call_budget_ms(state.request) if p.budget_aware else None
        if (budget is None or budget <= 0) and p.metric == "total":
            return state.relative_speed  # computed once, shared with other scorers
        pred = state.prediction
        times = state.c(pred.total_ms if p.metric == "total" else pred.ttft_ms)
        if budget is None or budget <= 0:
            return ratio_low_is_better(times)
        comfort = budget * p.budget_comfort
        if p.budget_comfort >= 1.0:
            return (times <= budget).astype(np.float64)
        return ((budget - times) / (budget - comfort)).clip(0.0, 1.0)
