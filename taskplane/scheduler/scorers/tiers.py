"""KV tiers (axis 3 below GPU memory): credit a replica for the prompt blocks its host tier
holds past its GPU prefix.

Two ways to credit a host block, one scorer each:

* ``tiered-prefix``: by the prefill time it saves, load time against recompute (taskplane),
  or by a fixed weight (llm-d's tiered prefix scorer: GPU 1.0, CPU 0.8);
* ``dynamo-kvbm-cost``: NVIDIA Dynamo's KV router cost with its KV block manager's tier
  weights (host 0.75, disk 0.25) in the overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework.plugin import param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.scorers.cache import PrefixCacheParams, PrefixCacheScorer
from taskplane.scheduler.scorers.cost import DynamoCostParams, DynamoCostScorer


@dataclass(slots=True)
class TieredPrefixParams(PrefixCacheParams):
    host_weight: float | None = param(
        None,
        "fixed credit of a host-tier block against a GPU block (llm-d: 0.8); unset: the share of "
        "its prefill time a host block saves, 1 - load time / recompute time",
    )
    load_us_per_token: float = param(
        3.3, "host -> GPU transfer time per token (128 KiB of KV per token over ~40 GB/s of PCIe)"
    )
    recompute_us_per_token: float = param(
        33.0, "prefill time per token when the latency model has no estimate (an 8B model on an H100)"
    )


@register("tiered-prefix")
class TieredPrefixScorer(PrefixCacheScorer):
    """Share of the prompt's prefill time a replica saves: GPU blocks in full, host blocks
    past them by their credit (see :class:`TieredPrefixParams`); without a host tier, the
    ``prefix-cache`` ratio."""

    Params = TieredPrefixParams

    def ratio(self, state: CycleState, blocks: int) -> np.ndarray:
        gpu = state.c(state.matched(self.params.source))
        host = state.c(state.tier_matched(self.params.source)) - gpu
        if not host.any():  # GPU only (no host tier reported): the plain prefix ratio
            return np.minimum(gpu / blocks, 1.0)
        return np.minimum((gpu + self.host_credit(state) * host) / blocks, 1.0)

    def host_credit(self, state: CycleState) -> np.ndarray | float:
        """What one host block is worth against one GPU block, per candidate."""
        p: TieredPrefixParams = self.params
        if p.host_weight is not None:
            return p.host_weight
        uncached = state.c(state.uncached_tokens(p.source))
        # the latency model's prefill time for the uncached suffix, per token
        per_tok_us = np.where(uncached > 0, state.c(state.prediction.prefill_ms) * 1000.0 / np.maximum(uncached, 1.0),
                              p.recompute_us_per_token)
        per_tok_us = np.maximum(per_tok_us, 1e-9)
        return np.clip(1.0 - p.load_us_per_token / per_tok_us, 0.0, 1.0)


@dataclass(slots=True)
class DynamoKvbmParams(DynamoCostParams):
    host_weight: float = param(0.75, "a host-tier (G2) block's share of a GPU block in the overlap")
    disk_weight: float = param(0.25, "a disk-tier (G3) block's share (no per-replica disk tier is reported yet)")


@register("dynamo-kvbm-cost")
class DynamoKvbmCostScorer(DynamoCostScorer):
    """Dynamo's KV router cost (``dynamo-cost``) where the overlap counts the host blocks
    past the GPU prefix at ``host_weight`` (Dynamo's KV block manager tiers)."""

    Params = DynamoKvbmParams

    def overlap(self, state: CycleState) -> np.ndarray:
        p: DynamoKvbmParams = self.params
        gpu = state.c(state.matched(p.source))
        return gpu + p.host_weight * (state.c(state.tier_matched(p.source)) - gpu)
