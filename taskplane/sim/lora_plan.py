"""Adapter pre-loads in the cluster simulator: a policy's plan of which adapters to load
where ahead of demand, carried out on the engines as ``POST /v1/load_lora_adapter`` would.

A policy plans when its pipeline holds a plugin with ``plan(views, now_s)`` and
``preloaded(replica, adapter)`` whose params turn ``preload`` on (the ``adapter-residency``
scorer). The plan runs at most every ``every_s`` virtual seconds, at a call's offer (so a
run without adapter calls, or without such a plugin, is untouched), from the views a live
picker would have; each pre-load reads the adapter's weights into the engine's host memory
and holds its next step for the read (``Adapters.preload``).
"""

from __future__ import annotations

from typing import Any

from taskplane.scheduler.scorers.residency import find_planner
from taskplane.scheduler.types import ReplicaView

__all__ = ["Preloads", "find_planner"]


class Preloads:
    """Runs ``planner``'s plan on ``fleet``'s engines every ``every_s`` virtual seconds."""

    def __init__(self, planner: Any, fleet: Any, every_s: float = 1.0) -> None:
        self.planner, self.fleet, self.every_s = planner, fleet, every_s
        self._next = 0.0

    def maybe_plan(self, now_s: float) -> None:
        if now_s < self._next:
            return
        self._next = now_s + self.every_s
        self.fleet.snapshot()
        views: list[ReplicaView] = [v for v in self.fleet.views if v.max_loras > 0]
        for replica, adapter in self.planner.plan(views, now_s):
            i = self.fleet.find(replica)
            engine = self.fleet.engines[i] if i is not None else None
            if engine is not None and engine.adapters is not None and engine.adapters.preload(adapter, now_s):
                self.planner.preloaded(replica, adapter)
                self.fleet.mark(i)
