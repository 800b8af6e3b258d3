"""KV working-set admission: how flow control tells the pipeline's per-decision state which
replicas are saturated (see ``AdmissionSettings.working_set_limits``).

A task's first call is admitted on a replica only while the contexts of the sessions
pinned there, plus the blocks it would allocate there, fit in its priority band's share of
the KV cache; the state computes that room from the session view, with the limit this rule
gives. A replica's host (CPU) KV tier can count too, at ``working_set_host_share`` of a GPU
block (a session parked there during a tool gap is reloaded, not recomputed; 0 by default,
as measured). A call without a task or session (a plain OpenAI client) is never held for
room: it has no later steps whose context a refusal would protect.
"""

from __future__ import annotations

from collections.abc import Callable

from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.scheduler.framework.handle import Load
from taskplane.scheduler.types import CallRequest


class WorkingSetLimit:
    """The share of a replica's KV cache a task's first call may fill with pinned
    contexts, or None when working-set admission does not apply to the call."""

    def __init__(self, settings: AdmissionSettings) -> None:
        self.settings = settings

    def __call__(self, request: CallRequest, starts_task: Callable[[], bool]) -> float | None:
        if request.session_id is None and request.task_id is None:
            return None  # a plain client: no session whose later steps a refusal would protect
        if not starts_task():
            return None
        settings = self.settings
        budget = request.budget_ms
        if budget is not None and budget < (
            settings.working_set_min_budget_retries * settings.working_set_retry_after_s * 1000.0
        ):
            return None  # too short a budget to wait out a refusal
        return settings.working_set_limits.get(request.priority)


def admission_load(settings: AdmissionSettings | None) -> Load:
    """The saturation rule of a pipeline composed by flow control with ``settings``."""
    if settings is None:
        return Load()
    return Load(
        max_waiting=settings.max_waiting_per_replica,
        holds_calls=True,
        room_limit=WorkingSetLimit(settings) if settings.working_set_limits else None,
        room_host_share=max(settings.working_set_host_share, 0.0),
    )


def working_set_on(settings: AdmissionSettings | None) -> bool:
    """Is working-set admission on?"""
    return settings is not None and bool(settings.working_set_limits)
