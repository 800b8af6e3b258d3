"""Memory headroom (axis 2) as a filter: free KV blocks against the blocks the call needs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework.normalise import keeps_all
from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Filter, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState


@dataclass(slots=True)
class MemoryHeadroomParams:
    min_free_ratio: float = param(
        1.0, "keep replicas whose free KV blocks are at least this multiple of the new blocks the call needs"
    )
    soft: bool = param(
        True, "when no replica has the headroom keep them all (the engine will queue the call) instead of none"
    )

    def validate(self) -> None:
        if self.min_free_ratio < 0:
            raise ValueError("min_free_ratio must be >= 0")


@register("memory-headroom")
class MemoryHeadroomFilter(Filter):
    """Drops replicas that would have to evict or queue to fit the call's KV blocks."""

    Params = MemoryHeadroomParams

    def filter(self, state: CycleState) -> np.ndarray | None:
        p: MemoryHeadroomParams = self.params
        needed = state.c(state.new_blocks_needed())
        ok = state.c(state.free) >= (needed if p.min_free_ratio == 1.0 else needed * p.min_free_ratio)
        return None if keeps_all(ok, p.soft) else ok

    def keeps(self, one: OneCandidate) -> bool:
        p: MemoryHeadroomParams = self.params
        # soft never empties the pool: it keeps every replica, and the KV index need not be asked
        return p.soft or one.free >= one.new_blocks_needed() * p.min_free_ratio
