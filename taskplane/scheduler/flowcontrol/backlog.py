"""Late binding under a prefill backlog (see ``AdmissionSettings.max_prefill_backlog_ms``).

A call sent to a replica waits behind the prefill work already committed to it, and on a
bursty trace that queue is what makes the TTFT tail: once dispatched, a call cannot move
when another replica frees first. Flow control therefore does not hand a call to a replica
whose queued prefill (the scheduler's own latency model: the prompt tokens still to prefill
there, at that GPU's calibrated rate) exceeds the threshold; while every eligible replica
is past it the call stays in the admission queue, and ``release`` gives it to the first
replica that drains below. Sessions with a live pin are not held: their context is on the
pinned replica, and moving or delaying them costs more than the queue they join.

Stateless: a mask per decision, computed from the per-decision state.
"""

from __future__ import annotations

import numpy as np

from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.scheduler.framework.state import CycleState


def queued_prefill_ms(state: CycleState) -> np.ndarray:
    """Per pool replica: the prefill milliseconds already committed to it (the latency
    model's queue time without any cold start)."""
    pred = state.prediction
    return pred.queue_ms - pred.idle[0]


def below_backlog(state: CycleState, settings: AdmissionSettings | None) -> np.ndarray | None:
    """Over the candidates: True where the replica's queued prefill is within the limit.
    None when late binding is off (no settings, or ``max_prefill_backlog_ms`` None)."""
    limit = None if settings is None else settings.max_prefill_backlog_ms
    if limit is None:
        return None
    return state.c(queued_prefill_ms(state)) <= limit
