"""What holding a call spares the others and what the hold costs it, from the scheduler's
latency model (the same per-GPU prefill rate the placement predictions use).

Admitting a call now slows the calls that share its replica: a prefill of T tokens runs in
the engine's steps next to every running sequence and ahead of every waiting prompt, so
each of them loses about T tokens' prefill time. ``slowdown_ms`` prices that for the extra
tokens an admission would force (the call's own prefill for late binding; for the working-
set rule, the pinned context the admission would push out and a later step must prefill
again). A hold pays only while the call's expected wait is below that slowdown, and it
never lasts longer: past it, the call is admitted as it would be with no rule.

Queues are *short* when some replica that can take the call has no engine-waiting call and
at most ``short_ms`` of queued prefill: any re-prefill the admission causes is absorbed
there, so a working-set rule holds nothing.
"""

from __future__ import annotations

import numpy as np

from taskplane.scheduler.framework.state import CycleState


def ms_per_token(state: CycleState) -> np.ndarray | float:
    """Per pool replica (or one scalar for a one-GPU pool): prefill ms per prompt token."""
    lat = state.handle.latency
    gpus = state.table.gpus
    if len(gpus) == 1:
        return 1000.0 / max(lat.gpu_row(gpus[0])[0], 1e-9)
    rate = lat.gpu_params(gpus)[state.gpu_codes][:, 0]
    return 1000.0 / np.maximum(rate, 1e-9)


def sharers(state: CycleState) -> np.ndarray:
    """Per pool replica: the calls an admission there would slow (running and waiting)."""
    return state.running + state.waiting


def slowdown_ms(state: CycleState, extra_tokens: np.ndarray | float) -> np.ndarray:
    """Per pool replica: the milliseconds other calls lose in total if ``extra_tokens`` of
    prefill are admitted there now."""
    return np.asarray(extra_tokens * ms_per_token(state) * np.maximum(sharers(state), 1.0), dtype=np.float64)


def queued_prefill_ms(state: CycleState) -> np.ndarray:
    """Per pool replica: the prefill milliseconds already committed to it (the latency
    model's queue time without any cold start)."""
    pred = state.prediction
    return pred.queue_ms - pred.idle[0]


def queues_short(state: CycleState, free: np.ndarray, short_ms: float | None) -> bool:
    """Can a replica among the candidates ``free`` (a mask over them) take the call with no
    engine queue and at most ``short_ms`` of queued prefill?"""
    if short_ms is None or not free.any():
        return False
    idle = (state.c(state.waiting) <= 0) & (state.c(queued_prefill_ms(state)) <= short_ms) & free
    return bool(idle.any())
