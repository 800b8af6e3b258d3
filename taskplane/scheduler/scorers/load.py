"""Load scorers (the baselines' and llm-d's): queue length, KV usage, running + waiting."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework.normalise import minmax_low_is_better
from taskplane.scheduler.framework.plugin import Scorer, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState


@dataclass(slots=True)
class QueueParams:
    include_running: bool = param(False, "count running requests too, not only waiting ones")


@register("queue")
class QueueScorer(Scorer):
    """llm-d queue-scorer: (max - waiting) / (max - min) over candidates; all equal -> 1."""

    Params = QueueParams

    def score(self, state: CycleState) -> np.ndarray:
        q = state.c(state.waiting)
        if self.params.include_running:
            q = q + state.c(state.running)
        return minmax_low_is_better(q)


@register("kv-usage")
class KvUsageScorer(Scorer):
    """llm-d kv-cache-utilization-scorer: 1 - used KV blocks / total KV blocks."""

    def score(self, state: CycleState) -> np.ndarray:
        total = state.c(state.total)
        return (state.c(state.free) / total).clip(0.0, 1.0)


@register("least-loaded")
class LeastLoadedScorer(Scorer):
    """Fewest running + waiting requests: (max - load) / (max - min); all equal -> 1."""

    def score(self, state: CycleState) -> np.ndarray:
        return minmax_low_is_better(state.c(state.running) + state.c(state.waiting))
