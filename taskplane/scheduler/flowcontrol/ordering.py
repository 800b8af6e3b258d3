"""The order queued calls leave in: priority bands and earliest deadline first (``priority-edf``),
and weighted fair share between tenants inside a band (``weighted-fair-share``). Both shape
the per-pool :class:`AdmissionQueue` (flowcontrol/queue.py gives the order in full)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from taskplane.scheduler.flowcontrol.base import FlowPlugin
from taskplane.scheduler.flowcontrol.queue import AdmissionQueue
from taskplane.scheduler.framework.plugin import param
from taskplane.scheduler.framework.registry import register


@register("priority-edf")
class PriorityEdf(FlowPlugin):
    """Serve the most urgent priority band first (critical > interactive > standard > batch),
    and inside a tenant's share the earliest deadline first (calls with no deadline last)."""

    role = "ordering"

    @dataclass(slots=True)
    class Params:
        edf: bool = param(True, "earliest deadline first inside a tenant's share; false: first come first served")


@register("weighted-fair-share")
class WeightedFairShare(FlowPlugin):
    """Start-time fair queueing between the tenants of a band, by their configured weights:
    a tenant of weight 2 gets twice the share of one of weight 1 while both have calls queued."""

    role = "fairness"

    @dataclass(slots=True)
    class Params:
        fair_unit: Literal["tokens", "calls"] = param(
            "tokens", "what a call costs its tenant's share: tokens (prompt + max_tokens) or calls")


def make_queue(
    pool: str, ordering: PriorityEdf | None, fairness: WeightedFairShare | None, weight_of: Callable[[str], float]
) -> AdmissionQueue:
    """A pool's admission queue, ordered as the two plugins say (their defaults when absent)."""
    edf = ordering.params.edf if ordering is not None else True
    unit = fairness.params.fair_unit if fairness is not None else "tokens"
    weights = weight_of if fairness is not None else None
    return AdmissionQueue(pool, weight_of=weights, fair_unit=unit, edf=edf)
