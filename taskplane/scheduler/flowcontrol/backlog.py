"""Late binding under a prefill backlog (``prefill-backlog``).

A call sent to a replica waits behind the prefill already committed to it, and once
dispatched it cannot move when another replica frees first. So a call is not handed to a
replica whose queued prefill (the latency model's: prompt tokens still to prefill there,
at its GPU's calibrated rate) exceeds ``max_prefill_backlog_ms``; while every eligible
replica is past it the call waits in the admission queue and goes to the first replica
that drains below. Sessions with a live pin are not held: their context is on the pinned
replica, and moving or delaying them costs more than the queue they join.

The hold must pay (flowcontrol/holdcost.py): a call is held only while its expected wait
(the least backlog above the limit) is below the slowdown its prefill would cause the
calls sharing that replica now, and never longer than that slowdown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.flowcontrol.base import FlowPlugin
from taskplane.scheduler.flowcontrol.holdcost import queued_prefill_ms, slowdown_ms
from taskplane.scheduler.framework.plugin import param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState


@register("prefill-backlog")
class PrefillBacklog(FlowPlugin):
    """Bind a call late: keep it off replicas whose queued prefill passes a limit while the
    hold pays, so it goes to the first replica that drains."""

    role = "backlog"

    @dataclass(slots=True)
    class Params:
        max_prefill_backlog_ms: float | None = param(
            1000.0, "a call is not dispatched to a replica with more queued prefill than this (ms, by the "
            "latency model); null: off")
        pays: bool = param(
            False, "hold only while the expected wait is below the slowdown the call's prefill would cause "
            "the calls sharing the replica now, and never longer (false: hold until a replica drains)")

        def validate(self) -> None:
            if self.max_prefill_backlog_ms is not None and self.max_prefill_backlog_ms < 0:
                raise ValueError("max_prefill_backlog_ms must be >= 0 or null")

    @property
    def on(self) -> bool:
        return self.params.max_prefill_backlog_ms is not None

    def late_bind(self, state: CycleState, free: np.ndarray, n_free: int, *, queued: bool,
             held_s: float = 0.0, max_hold_s: float = math.inf) -> tuple[np.ndarray, int, float]:
        """``free`` (a mask over the candidates) less the replicas past the backlog, with
        how long the call may be held for it (inf: no cap).

        A new call (``queued`` False) that finds one replica below the limit is placed over
        every free replica, as without the rule; one that finds none is held only when
        holding pays. A queued call goes only to a replica below the limit until its hold
        reaches ``max_hold_s``."""
        limit = self.params.max_prefill_backlog_ms
        if n_free == 0 or limit is None:
            return free, n_free, math.inf
        pinned = state.pinned
        if pinned >= 0 and state.candidate_position(pinned) >= 0:
            return free, n_free, math.inf
        queued_ms = state.c(queued_prefill_ms(state))
        kept = free & (queued_ms <= limit)
        n_kept = int(np.count_nonzero(kept))
        if n_kept:
            return (kept, n_kept, math.inf) if queued else (free, n_free, math.inf)
        if queued:
            if held_s >= max_hold_s:
                return free, n_free, max_hold_s
            return kept, 0, max_hold_s
        if not self.params.pays:
            return kept, 0, math.inf
        wait_ms = float((queued_ms[free] - limit).min())
        spared_ms = float(state.c(slowdown_ms(state, state.uncached_tokens()))[free].min())
        if wait_ms >= spared_ms:
            return free, n_free, 0.0
        return kept, 0, spared_ms / 1000.0
