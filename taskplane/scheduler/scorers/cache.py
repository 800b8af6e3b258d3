"""KV cache state (axis 3): go where the prompt's prefix already lives, and spread the
KV that new tasks' sessions will hold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from prometheus_client import Histogram

from taskplane.scheduler.framework.plugin import Scorer, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
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

    @property
    def kv_source(self) -> str | None:
        return str(self.params.source)

    def score(self, state: CycleState) -> np.ndarray:
        blocks = state.prompt_blocks
        if blocks <= 0:
            return np.zeros(len(state.sel))
        ratio = np.minimum(state.c(state.matched(self.params.source)) / blocks, 1.0)
        if ratio.size and state.handle.metrics:
            self._ratio.observe(float(ratio.max()))
        return ratio


@dataclass(slots=True)
class WorkingSetParams:
    fits: float = param(
        0.5,
        "while every candidate's pinned contexts plus this task's fit in this share of its KV "
        "cache, all score 1 (nothing would be evicted, so balance buys nothing)",
    )


@register("working-set")
class WorkingSetScorer(Scorer):
    """Spread new tasks by the KV their sessions will hold, not only by their first prompt.

    For a task's first call only: 1 minus how much more of its KV cache a replica's pinned
    session contexts (plus this task's) fill than the emptiest candidate's, clipped at 0.
    A new task's prefix match is usually just its agent's shared system prompt, which pulls
    every task of one agent type onto one replica; on small caches that replica then evicts
    paused sessions while the other idles (seen on real vLLM: a 34/66 split). Later calls
    score 1 everywhere: session affinity keeps them where their context is.
    """

    Params = WorkingSetParams

    def score(self, state: CycleState) -> np.ndarray:
        out = np.ones(len(state.sel))
        pins = state.handle.sessions
        if pins is None or not state.starts_task or out.size < 2:
            return out
        pins.sweep(state.now_s)
        ws = state.c(pins.working_sets_of_rows(state.table, state.rows))
        need = state.request.prompt_tokens + state.completion_tokens
        capacity = state.c(state.total) * state.c(state.block_size)
        pressure = (ws + need) / np.maximum(capacity, 1.0)
        if float(pressure.max()) <= self.params.fits:
            return out
        return (1.0 - (pressure - float(pressure.min()))).clip(0.0, 1.0)
