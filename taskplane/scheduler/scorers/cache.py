"""KV cache state (axis 3) and session pins: go where the prompt's prefix already lives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from prometheus_client import Histogram

from taskplane.scheduler.framework import CycleState, Scorer, param, register
from taskplane.scheduler.metrics import SCORE_BUCKETS

MATCH_RATIO = Histogram(
    "taskplane_scheduler_prefix_match_ratio",
    "best prefix match ratio among candidates (matched blocks / prompt blocks)",
    ["policy"],
    buckets=SCORE_BUCKETS,
)


@dataclass(slots=True)
class PrefixCacheParams:
    source: Literal["auto", "precise", "approximate"] = param(
        "auto",
        "which KV index answers: precise (vLLM KV events), approximate (the gateway's own routing "
        "history) or auto (precise for in-sync event publishers, else the better of both)",
    )


@register("prefix-cache")
class PrefixCacheScorer(Scorer):
    """Fraction of the prompt's leading blocks already cached on the replica."""

    Params = PrefixCacheParams

    def __init__(self, params: PrefixCacheParams, **kw: object) -> None:
        super().__init__(params, **kw)  # type: ignore[arg-type]
        self._ratio = MATCH_RATIO.labels(self.policy)

    def score(self, state: CycleState) -> np.ndarray:
        blocks = state.prompt_blocks
        if blocks <= 0:
            return np.zeros(len(state.sel))
        ratio = np.minimum(state.c(state.matched(self.params.source)) / blocks, 1.0)
        if ratio.size:
            self._ratio.observe(float(ratio.max()))
        return ratio


@dataclass(slots=True)
class SessionAffinityParams:
    break_when_saturated: bool = param(
        True, "give the pinned replica no bonus when it is saturated, so the session moves to the best overlap"
    )


@register("session-affinity")
class SessionAffinityScorer(Scorer):
    """1 for the replica the call's session is pinned to (its KV cache), 0 elsewhere.

    The pin outlives tool-call gaps by a TTL learned per agent (``SessionPins``); when the
    pinned replica is gone, unhealthy, filtered out or saturated the bonus disappears and
    the prefix scorer moves the session to the replica with the best remaining overlap.
    """

    Params = SessionAffinityParams

    def score(self, state: CycleState) -> np.ndarray:
        out = np.zeros(len(state.sel))
        pinned = state.pinned
        if pinned < 0:
            return out
        pos = np.flatnonzero(state.sel == pinned)
        if pos.size == 0:
            return out
        if self.params.break_when_saturated and bool(state.saturated[pinned]):
            return out
        out[pos[0]] = 1.0
        return out
