"""Workflow context (axis 7): protect the late steps of expensive tasks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework.plugin import Scorer, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.workflow import protection


@dataclass(slots=True)
class WorkflowContextParams:
    reference_sunk_usd: float = param(
        0.10, "sunk cost at which a task counts as half-way expensive (protection 0.5 x lateness)"
    )


@register("workflow-context")
class WorkflowContextScorer(Scorer):
    """Protects the late steps of expensive tasks.

    protection p = sunk/(sunk + reference) x (0.5 + 0.5 x progress), progress = step /
    (step + steps remaining). Score = p x (fastest predicted total / this one's) + (1 - p):
    the last step of an expensive chain goes where it is least likely to be late, while a
    fresh cheap call is left to the other axes (thrift is the price scorer's job; an
    earlier version steered fresh calls to the lowest hourly price, which in simulation put
    them on slow GPUs and raised both TTFT and cost).
    """

    Params = WorkflowContextParams

    def score(self, state: CycleState) -> np.ndarray:
        p = protection(state.request, self.params.reference_sunk_usd)
        if p <= 0.0:
            return np.ones(len(state.sel))
        safe = state.relative_speed
        return p * safe + (1.0 - p)
