"""Shedding (``shed``): which replicas count as saturated, and which calls are refused with
429 + Retry-After instead of queued: a call that would wait past its deadline, and the least
valuable call once a pool's queue is full (critical calls never)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from taskplane.scheduler.flowcontrol.base import FlowPlugin
from taskplane.scheduler.flowcontrol.queue import AdmissionQueue, QueuedCall
from taskplane.scheduler.framework.plugin import param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.types import CallRequest
from taskplane.scheduler.workflow import task_value


@register("shed")
class Shedding(FlowPlugin):
    """Refuse (429 + Retry-After) what cannot be served in time: a call whose queue wait plus
    service would pass its deadline, and the least valuable call of a full queue."""

    role = "shedding"

    @dataclass(slots=True)
    class Params:
        max_waiting_per_replica: int = param(
            2, "a replica with this many engine-queued calls is saturated: new calls queue instead")
        max_queue: int = param(4096, "calls held per pool; beyond it the least valuable call is shed")
        shed_bands: tuple[str, ...] = param(
            ("interactive", "standard", "batch"), "priority bands that may be shed (critical never is)")
        min_retry_after_s: float = param(1.0, "the shortest Retry-After a refusal gives")
        max_retry_after_s: float = param(60.0, "the longest Retry-After a refusal gives")

        def validate(self) -> None:
            if self.max_waiting_per_replica < 1 or self.max_queue < 1:
                raise ValueError("max_waiting_per_replica and max_queue must be >= 1")
            if not 0 < self.min_retry_after_s <= self.max_retry_after_s:
                raise ValueError("need 0 < min_retry_after_s <= max_retry_after_s")

    def retry_after(self, wait_s: float) -> float:
        p = self.params
        return float(min(max(math.ceil(wait_s), p.min_retry_after_s), p.max_retry_after_s))

    def misses_deadline(self, req: CallRequest, wait_s: float, service_s: float) -> bool:
        """Would ``req`` (sheddable) wait past its budget?"""
        return (req.budget_ms is not None and wait_s + service_s > req.budget_ms / 1000.0
                and req.priority in self.params.shed_bands)

    def make_room(self, queue: AdmissionQueue, req: CallRequest, band: int) -> tuple[bool, QueuedCall | None]:
        """Before ``req`` joins a queue: (may it join, the call displaced to make room)."""
        if len(queue) < self.params.max_queue:
            return True, None
        victim = queue.victim()
        if victim is not None and (victim.band, -victim.value) > (band, -task_value(req)):
            queue.remove(victim.call)
            return True, victim
        return False, None
