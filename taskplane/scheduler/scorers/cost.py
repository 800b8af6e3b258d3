"""Price (axis 1) and the Dynamo-style KV cost."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework.normalise import minmax_low_is_better, ratio_low_is_better
from taskplane.scheduler.framework.plugin import Scorer, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.workflow import call_budget_ms


@dataclass(slots=True)
class GpuPriceParams:
    per_call: bool = param(
        True,
        "rank by the estimated cost of this call (hourly price x predicted service time: prefill "
        "of the uncached suffix + decode); false ranks by the plain hourly price",
    )
    budget_slack: float = param(1.0, "replicas predicted to exceed budget * slack score 0 while others meet it")


@register("gpu-price")
class GpuPriceScorer(Scorer):
    """Cheapest replica that still meets the call's latency budget.

    Score = cheapest estimated cost / this replica's; replicas predicted to miss the
    budget (this call's share of the task's remaining budget) score 0 whenever at least
    one replica meets it.
    """

    Params = GpuPriceParams

    def score(self, state: CycleState) -> np.ndarray:
        p: GpuPriceParams = self.params
        if p.per_call:
            pred = state.prediction
            # over the whole pool, then restricted once (fewer copies than restricting each input)
            cost = state.c(state.cost_per_hour / 3600.0 * ((pred.prefill_ms + pred.decode_ms) / 1000.0))
        else:
            cost = state.c(state.cost_per_hour)
        budget = call_budget_ms(state.request)
        if budget is not None:
            meets = state.c(state.prediction.total_ms) <= budget * p.budget_slack
            if 0 < np.count_nonzero(meets) < len(meets):  # some meet it, not all
                cheapest = max(float(cost[meets].min()), 1e-12)
                return np.where(meets, cheapest / np.maximum(cost, 1e-12), 0.0)
        return ratio_low_is_better(cost, floor=1e-12)


@dataclass(slots=True)
class DynamoCostParams:
    overlap_weight: float = param(
        1.0, "weight of the prefill blocks not cached on the replica against its active decode blocks"
    )
    source: str = param("auto", "KV index source for the overlap: auto, precise or approximate")


@register("dynamo-cost")
class DynamoCostScorer(Scorer):
    """NVIDIA Dynamo KV router cost: overlap_weight x uncached prompt blocks + active blocks,
    lowest wins; min-max normalised. Active blocks approximate Dynamo's own accounting of
    dispatched, unfinished requests: blocks in use + the prompt blocks queued on the replica
    + this call's prompt blocks."""

    Params = DynamoCostParams

    @property
    def kv_source(self) -> str | None:
        return str(self.params.source)

    def score(self, state: CycleState) -> np.ndarray:
        p: DynamoCostParams = self.params
        prompt_blocks = float(state.prompt_blocks)
        prefill_blocks = np.maximum(prompt_blocks - state.c(state.matched(p.source)), 0.0)
        queued_blocks = state.c(state.queued_tokens) / state.c(state.block_size)
        active = state.c(state.total) - state.c(state.free) + queued_blocks + prompt_blocks
        return minmax_low_is_better(p.overlap_weight * prefill_blocks + active)
