"""Long prefills placed by when they would finish, not by affinity.

A prompt with tens of thousands of tokens no replica holds (a long first turn) takes
several engine steps of prefill wherever it goes, and shares each step's token budget with
every other prefill on its replica. Affinity cannot save it much (the best match covers a
small share of it), but landing behind another long prefill can cost it seconds: on the
Mooncake trace such prompts were most of taskplane's slowest 1 %, while Dynamo's cost,
which counts each replica's queued prefill, spread them.

So when even the best-matching candidate leaves at least ``min_uncached_tokens`` to
prefill, this filter keeps only the replicas where the call's prefill is predicted to
finish first: the prefill already committed there (the latency model's queue time) plus
the call's own uncached suffix at that replica's calibrated rate, within ``slack`` of the
earliest. Affinity and the other scorers then choose among those. Shorter calls keep
today's pipeline (the warm prefix is worth more than the queue) unless the replica affinity
would choose ends their prefill more than ``max_wait_ms`` after the earliest; a session
whose pinned replica has more prefill queued than that is decided over the pool
(``releases_pin``).

Only replicas that can take the call now count toward the earliest finish (a saturated
replica would only hold it); when none can, the filter keeps everyone and admission decides.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Filter, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState


@dataclass(slots=True)
class PrefillFinishParams:
    min_uncached_tokens: int = param(
        32768,
        "engage when the best-matching candidate still leaves this many prompt tokens to prefill "
        "(the default, four 8,192-token step budgets, is above every prompt of the agent benches)",
    )
    load_us_per_token: float = param(
        3.3, "host -> GPU transfer per token of a host-tier hit (as tiered-prefix's): counted instead of its recompute"
    )
    slack: float = param(0.05, "keep replicas whose predicted prefill end is within (1 + slack) x the earliest")
    max_wait_ms: float | None = param(
        1000.0,
        "also engage, for a call of any length, when the replica affinity would choose (the session's pin, "
        "else the deepest prefix match) would end its prefill more than this many ms after the earliest; "
        "a pinned session leaves its replica for the pool when the prefill queued there exceeds it. "
        "None: long prompts only (both defaults keep the agent benches' placements unchanged)",
    )

    def validate(self) -> None:
        if self.min_uncached_tokens < 1 or self.slack < 0 or (self.max_wait_ms is not None and self.max_wait_ms < 0):
            raise ValueError("min_uncached_tokens must be >= 1, slack and max_wait_ms >= 0")


def uncached_tokens(state: CycleState) -> np.ndarray:
    """Per pool replica: prompt tokens neither its GPU nor its host tier holds."""
    req = state.request
    return np.maximum(req.prompt_tokens - state.tier_matched() * req.block_size, 0.0)


def prefill_end_ms(state: CycleState, load_us_per_token: float = 3.3) -> np.ndarray:
    """Per pool replica: when this call's prefill would end there, from now: the prefill
    queued ahead and any cold start, then its own suffix past the GPU prefix (the scheduler's
    latency model), with the host-tier part of it loaded at ``load_us_per_token`` instead of
    recomputed. Without a host tier: queue + prefill of the uncached suffix, exactly."""
    pred = state.prediction
    gpu_uncached = state.uncached_tokens()
    cold = uncached_tokens(state)
    if not np.any(cold < gpu_uncached):
        return pred.queue_ms + pred.prefill_ms
    per_token_ms = pred.prefill_ms / np.maximum(gpu_uncached, 1.0)
    return pred.queue_ms + per_token_ms * cold + (gpu_uncached - cold) * load_us_per_token / 1000.0


@register("prefill-finish")
class PrefillFinishFilter(Filter):
    """For a long uncached prefill: only the replicas where it would finish first."""

    Params = PrefillFinishParams

    def filter(self, state: CycleState) -> np.ndarray | None:
        p: PrefillFinishParams = self.params
        limit = p.max_wait_ms
        long = state.request.prompt_tokens >= p.min_uncached_tokens
        if not long and limit is None:
            return None  # cannot engage: no array work on the common path
        if long:
            long = float(state.c(uncached_tokens(state)).min()) >= p.min_uncached_tokens
        if not long and limit is None:
            return None  # a replica's match covers enough: affinity decides
        end = state.c(prefill_end_ms(state, p.load_us_per_token))
        able = ~state.c(state.saturated)
        if not able.any():
            return None
        earliest = float(end[able].min())
        if not long and limit is not None and float(end[_affinity_choice(state, end)]) - earliest <= limit:
            return None  # the warm replica costs little wait: affinity decides
        return able & (end <= earliest * (1.0 + p.slack))

    def keeps(self, one: OneCandidate) -> bool:
        return True  # over a pool of one the pinned replica ends first by definition

    def releases_pin(self, one: OneCandidate) -> bool:
        """A session leaves its pinned replica for the pool (this filter included) when the
        prefill queued there exceeds ``max_wait_ms``."""
        limit = self.params.max_wait_ms
        if limit is None or (one.inflight_prefill <= 0 and one.waiting <= 0):
            return False
        return one.prediction.queue_ms > limit


def _affinity_choice(state: CycleState, end: np.ndarray) -> int:
    """Candidate position affinity would pick: the session's pin when it is a candidate,
    else the deepest prefix match (the earliest prefill end among equals)."""
    pinned = state.pinned
    if pinned >= 0:
        pos = state.candidate_position(pinned)
        if pos >= 0:
            return pos
    matched = state.c(state.tier_matched())
    deepest = matched == matched.max()
    return int(np.flatnonzero(deepest)[np.argmin(end[deepest])])
