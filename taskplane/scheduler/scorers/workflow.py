"""Workflow context (axis 7): protect late steps of expensive tasks, economise on fresh ones."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework import CycleState, Scorer, param, ratio_low_is_better, register
from taskplane.scheduler.workflow import protection


@dataclass(slots=True)
class WorkflowContextParams:
    reference_sunk_usd: float = param(
        0.10, "sunk cost at which a task counts as half-way expensive (protection 0.5 x lateness)"
    )


@register("workflow-context")
class WorkflowContextScorer(Scorer):
    """Blends safety and thrift by how much the task has at stake.

    protection p = sunk/(sunk + reference) x (0.5 + 0.5 x progress), progress = step /
    (step + steps remaining). Score = p x (fastest predicted total / this one's) +
    (1 - p) x (cheapest hourly price / this one's): the last step of an expensive chain goes
    where it is least likely to be late, a fresh cheap call goes where it costs least.
    """

    Params = WorkflowContextParams

    def score(self, state: CycleState) -> np.ndarray:
        p = protection(state.request, self.params.reference_sunk_usd)
        cheap = ratio_low_is_better(state.c(state.cost_per_hour), floor=1e-12)
        if p <= 0.0:
            return cheap
        safe = ratio_low_is_better(state.c(state.prediction.total_ms))
        return p * safe + (1.0 - p) * cheap
