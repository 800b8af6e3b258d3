"""SGLang router's cache-aware policy, as a picker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from taskplane.scheduler.framework.plugin import Picker, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.pickers.basic import argmax_seeded, argmin_seeded


@dataclass(slots=True)
class SglangParams:
    balance_abs_threshold: float = param(64.0, "imbalanced when max load - min load exceeds this ...")
    balance_rel_threshold: float = param(1.5, "... and max load exceeds min load times this")
    cache_threshold: float = param(0.3, "use the best prefix match only when its match ratio exceeds this")
    source: Literal["auto", "precise", "approximate"] = param(
        "approximate", "KV index source; SGLang's router matches against its own routing history"
    )
    low_match: Literal["least-loaded", "smallest-cache"] = param(
        "least-loaded",
        "below the threshold go to the least loaded replica, or (as sgl-router does) to the one "
        "with the smallest cached-prefix tree",
    )


@register("sglang-cache-aware")
class SglangCacheAwarePicker(Picker):
    """If load is imbalanced (max - min > 64 and max > 1.5 x min): shortest queue. Else the
    best prefix match if its ratio > 0.3, else the least loaded. Load = running + waiting."""

    Params = SglangParams

    @property
    def kv_source(self) -> str | None:
        return str(self.params.source)

    def pick(self, state: CycleState, totals: np.ndarray) -> int:
        p: SglangParams = self.params
        load = state.c(state.running) + state.c(state.waiting)
        lo, hi = float(load.min()), float(load.max())
        if hi - lo > p.balance_abs_threshold and hi > lo * p.balance_rel_threshold:
            return argmin_seeded(load, state.rng)
        req = state.request
        if req.prompt_tokens > 0:
            matched_tokens = np.minimum(state.c(state.matched(p.source)) * req.block_size, req.prompt_tokens)
            ratio = matched_tokens / req.prompt_tokens
            best = argmax_seeded(ratio, state.rng)
            if ratio[best] > p.cache_threshold:
                return best
        if p.low_match == "smallest-cache":
            approx = state.handle.kv_index.approx
            sizes = np.array([approx.size_of(state.name(int(i))) for i in state.sel], dtype=np.float64)
            return argmin_seeded(sizes, state.rng)
        return argmin_seeded(load, state.rng)
