"""The gateway's side of placement: it turns live registry state into the scheduler's
plain snapshot, asks the pure core for a decision, and (for queued calls) waits until
admission control lets the call through.

``SessionAffinityPlacer`` is the walking skeleton's policy (same session → the replica
it last used while that replica is healthy, otherwise the least loaded); the scheduler
core replaces it through the same interface.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Protocol

from taskplane.engines.registry import ReplicaRegistry
from taskplane.scheduler.types import Action, CallRequest, Decision, ReplicaView


class Placer(Protocol):
    async def place(self, req: CallRequest, *, exclude: set[str]) -> Decision: ...

    def completed(
        self, req: CallRequest, decision: Decision, *, ok: bool, ttft_ms: float | None,
        total_ms: float, cached_tokens: int,
    ) -> None: ...

    def replica_removed(self, name: str) -> None: ...


class SessionAffinityPlacer:
    """Same session → same replica while it is healthy; else the least loaded one."""

    def __init__(self, registry: ReplicaRegistry, max_sessions: int = 100_000) -> None:
        self.registry = registry
        self.pins: OrderedDict[str, str] = OrderedDict()
        self.max_sessions = max_sessions

    def _candidates(self, req: CallRequest, exclude: set[str]) -> list[ReplicaView]:
        return [v for v in self.registry.views(req.model) if v.healthy and v.name not in exclude]

    async def place(self, req: CallRequest, *, exclude: set[str]) -> Decision:
        views = self._candidates(req, exclude)
        if not views:
            return Decision(Action.NO_REPLICA, reason=f"no healthy replica serves {req.model}")
        by_name = {v.name: v for v in views}
        if req.session_id and (pinned := self.pins.get(req.session_id)) in by_name:
            self.pins.move_to_end(req.session_id)
            return Decision(Action.PLACE, replica=pinned, model=req.model, reason="session pin")
        best = min(views, key=lambda v: (v.num_running + v.num_waiting, v.name))
        if req.session_id:
            self.pins[req.session_id] = best.name
            while len(self.pins) > self.max_sessions:
                self.pins.popitem(last=False)
        return Decision(Action.PLACE, replica=best.name, model=req.model, reason="least loaded")

    def completed(
        self, req: CallRequest, decision: Decision, *, ok: bool, ttft_ms: float | None,
        total_ms: float, cached_tokens: int,
    ) -> None:
        if not ok and req.session_id and self.pins.get(req.session_id) == decision.replica:
            del self.pins[req.session_id]

    def replica_removed(self, name: str) -> None:
        for s in [s for s, r in self.pins.items() if r == name]:
            del self.pins[s]


def now_s() -> float:
    return time.monotonic()
