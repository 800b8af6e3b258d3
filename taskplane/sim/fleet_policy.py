"""The placement policy as an autoscaled fleet lets it see the pool.

Around the one scheduler object every autoscaler shares, :class:`FleetPolicy` keeps
cordoned replicas for their own sessions, holds calls while the pool has no ready replica
(never refusing them), and remembers where each session's KV lives (the pinned working
sets the autoscaler weighs at scale-in).
"""

from __future__ import annotations

from typing import Any

from taskplane.autoscale.fleet import FleetBook
from taskplane.scheduler.cordon import SessionHomes
from taskplane.scheduler.types import Action, CallOutcome, CallRequest, Decision


class FleetPolicy:
    """The placement policy as the fleet lets it see the pool (see the module docstring)."""

    def __init__(self, inner: Any, book: FleetBook) -> None:
        self.inner, self.book = inner, book
        self.homes = SessionHomes()  # session -> the replica holding its KV
        self.held: list[CallRequest] = []
        self.on_kv_events = getattr(inner, "on_kv_events", None)
        if self.on_kv_events is None:
            del self.on_kv_events

    def __getattr__(self, name: str) -> Any:
        if name in ("replica_failed",):
            return getattr(self.inner, name)
        raise AttributeError(name)

    @property
    def queued(self) -> int:
        return len(self.held) + int(getattr(self.inner, "queued", 0))

    @property
    def pending(self) -> bool:
        return bool(self.held) or bool(getattr(self.inner, "pending", False))

    def decide(self, req: CallRequest, replicas: Any, now_s: float) -> Decision:
        self.homes.avoid(req, self.book.closed_to_new_sessions())
        d: Decision = self.inner.decide(req, replicas, now_s)
        if d.action is Action.NO_REPLICA:  # the pool is empty or waking: hold, never refuse
            self.held.append(req)
            return Decision(Action.QUEUE, reason="held while a replica wakes")
        if d.action is Action.PLACE and d.replica is not None:
            self.homes.placed(req, d.replica)
        return d

    def release(self, replicas: Any, now_s: float) -> list[tuple[CallRequest, Decision]]:
        out: list[tuple[CallRequest, Decision]] = []
        if self.held and any(self.book.placeable(n) for n in self.book.replicas):
            held, self.held = self.held, []
            for req in held:
                out.append((req, self.decide(req, replicas, now_s)))
        if getattr(self.inner, "pending", False):
            for req, d in self.inner.release(replicas, now_s):
                if d.action is Action.PLACE and d.replica is not None:
                    self.homes.placed(req, d.replica)
                out.append((req, d))
        return out

    def observe_completion(self, request: CallRequest, outcome: CallOutcome, now_s: float) -> None:
        obs = getattr(self.inner, "observe_completion", None)
        if obs is not None:
            obs(request, outcome, now_s)
