"""The gateway's side of placement: it turns live registry state into the scheduler's
plain snapshot, asks the pure core for a decision, and (for queued calls) waits until
admission control lets the call through.

``SessionAffinityPlacer`` is the walking skeleton's policy (same session → the replica
it last used while that replica is healthy, otherwise the least loaded); the scheduler
core replaces it through the same interface.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from taskplane.engines.registry import ReplicaRegistry
from taskplane.scheduler.cordon import SessionHomes
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.types import Action, CallOutcome, CallRequest, Decision, ReplicaView


class Placer(Protocol):
    async def place(self, req: CallRequest, *, exclude: set[str]) -> Decision: ...

    def completed(
        self, req: CallRequest, decision: Decision, *, ok: bool, ttft_ms: float | None,
        total_ms: float, cached_tokens: int, completion_tokens: int = 0, batch_size: int | None = None,
    ) -> None: ...

    def replica_removed(self, name: str) -> None: ...

    def queue_depths(self) -> dict[str, dict[str, int]]: ...


class SessionAffinityPlacer:
    """Same session → same replica while it is healthy; else the least loaded one."""

    def __init__(self, registry: ReplicaRegistry, max_sessions: int = 100_000) -> None:
        self.registry = registry
        self.pins: OrderedDict[str, str] = OrderedDict()
        self.max_sessions = max_sessions

    def _candidates(self, req: CallRequest, exclude: set[str]) -> list[ReplicaView]:
        pinned = self.pins.get(req.session_id) if req.session_id else None
        closed = set(self.registry.cordoned(req.model)) - {pinned}  # cordoned: only its own sessions
        return [v for v in self.registry.views(req.model) if v.healthy and v.name not in exclude and v.name not in closed]

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
        total_ms: float, cached_tokens: int, completion_tokens: int = 0, batch_size: int | None = None,
    ) -> None:
        if not ok and req.session_id and self.pins.get(req.session_id) == decision.replica:
            del self.pins[req.session_id]

    def replica_removed(self, name: str) -> None:
        for s in [s for s, r in self.pins.items() if r == name]:
            del self.pins[s]

    def queue_depths(self) -> dict[str, dict[str, int]]:
        return {}  # it never queues


def now_s() -> float:
    return time.monotonic()


class ScheduledPlacer:
    """Places calls with the pure scheduler core; queued calls wait on a future until the
    core releases them (a call finished, a replica joined, or the pump's tick)."""

    PUMP_INTERVAL_S = 0.02

    def __init__(self, scheduler: Any, registry: ReplicaRegistry, *, max_wait_s: float = 120.0,
                 hold_when_empty: Mapping[str, float] | None = None) -> None:
        self.scheduler = scheduler
        self.registry = registry
        self.max_wait_s = max_wait_s
        # scale to zero: per pool, how long a call waits for a replica to join an empty pool
        self.hold_when_empty = dict(hold_when_empty or {})
        self._waiting: dict[int, tuple[CallRequest, asyncio.Future[Decision]]] = {}
        self._pump_task: asyncio.Task[None] | None = None
        self._held_for_replica: dict[int, CallRequest] = {}
        self._replica_up = asyncio.Event()  # set (then replaced) when a replica joins or recovers
        self.homes = SessionHomes()  # where each session last went: a cordoned replica still takes it
        registry.on_replica_up(self._wake_held_calls)

    def _views(self) -> ReplicaTable:
        """The registry's kept table: only replicas whose state changed are re-read."""
        return self.registry.table()

    async def place(self, req: CallRequest, *, exclude: set[str]) -> Decision:
        """A decision for the call: placed, refused, or (queued by admission) placed later.
        Cordoned replicas take only the calls of the sessions last placed on them."""
        closed = self.homes.closed_to(req, self.registry.cordoned(req.model))
        req.avoid_replicas = tuple(sorted(exclude.union(closed)))
        decision = await self._decide(req, exclude)
        if decision.action is Action.PLACE and decision.replica is not None:
            self.homes.placed(req, decision.replica)
        return decision

    async def _decide(self, req: CallRequest, exclude: set[str]) -> Decision:
        decision = self.scheduler.decide(req, self._views(), now_s())
        if decision.action is Action.NO_REPLICA and not exclude and self._pool_empty(req.model):
            hold_s = self.hold_when_empty.get(req.model, 0.0)
            if hold_s > 0:
                return await self._await_replica(req, exclude, hold_s)
        if decision.action is not Action.QUEUE:
            return decision
        fut: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._waiting[id(req)] = (req, fut)
        self._ensure_pump()
        wait_s = self.max_wait_s if req.budget_ms is None else max(0.05, req.budget_ms / 1000.0)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout=wait_s)
        except TimeoutError:
            self.scheduler.cancel(req)
            return Decision(Action.SHED, reason="waited in the admission queue until the budget ran out", retry_after_s=1.0)
        finally:
            self._waiting.pop(id(req), None)

    def _pool_empty(self, model: str) -> bool:
        return not any(s.healthy for s in self.registry.for_model(model))

    async def _await_replica(self, req: CallRequest, exclude: set[str], hold_s: float) -> Decision:
        """Hold a call for a pool scaled to zero until a replica is up (the autoscaler sees
        it in ``queue_depths``), then place it as any other; 503 if none joins in time."""
        if req.budget_ms is not None:
            hold_s = min(hold_s, req.budget_ms / 1000.0)
        loop = asyncio.get_running_loop()
        until = loop.time() + hold_s
        self._held_for_replica[id(req)] = req
        try:
            while self._pool_empty(req.model):
                came_up = self._replica_up
                try:
                    await asyncio.wait_for(came_up.wait(), timeout=max(0.0, until - loop.time()))
                except TimeoutError:
                    return Decision(Action.NO_REPLICA, reason=f"no replica of {req.model!r} came up within {hold_s:.0f} s")
        finally:
            self._held_for_replica.pop(id(req), None)
        return await self.place(req, exclude=exclude)

    def _wake_held_calls(self) -> None:
        """Wake every call held for an empty pool; each checks its own pool again."""
        self._replica_up.set()
        self._replica_up = asyncio.Event()

    def _ensure_pump(self) -> None:
        if self._pump_task is None or self._pump_task.done():
            self._pump_task = asyncio.create_task(self._pump_loop(), name="admission-pump")

    async def _pump_loop(self) -> None:
        while self._waiting:
            self.pump()
            await asyncio.sleep(self.PUMP_INTERVAL_S)

    def pump(self) -> None:
        """Hand released calls their decisions."""
        if not self._waiting:
            return
        for call, decision in self.scheduler.release(self._views(), now_s()):
            entry = self._waiting.get(id(call))
            if entry is not None and not entry[1].done():
                entry[1].set_result(decision)

    def queue_depths(self) -> dict[str, dict[str, int]]:
        """Calls held by admission control (or for an empty pool), per pool and priority band."""
        depths_of = getattr(self.scheduler, "queue_depths", None)
        depths: dict[str, dict[str, int]] = depths_of() if depths_of is not None else {}
        for req in self._held_for_replica.values():
            bands = depths.setdefault(req.model, {})
            bands[req.priority] = bands.get(req.priority, 0) + 1
        return depths

    def completed(
        self, req: CallRequest, decision: Decision, *, ok: bool, ttft_ms: float | None,
        total_ms: float, cached_tokens: int, completion_tokens: int = 0, batch_size: int | None = None,
    ) -> None:
        if decision.replica is None:
            return
        outcome = CallOutcome(
            replica=decision.replica, ok=ok, prompt_tokens=req.prompt_tokens, cached_tokens=cached_tokens,
            completion_tokens=completion_tokens, batch_size=batch_size,
            ttft_s=None if ttft_ms is None else ttft_ms / 1000.0, total_s=total_ms / 1000.0,
        )
        self.scheduler.observe_completion(req, outcome, now_s())
        if not ok:
            self.scheduler.replica_failed(decision.replica)
        self.pump()

    def replica_removed(self, name: str) -> None:
        self.scheduler.replica_removed(name)
        self.pump()

    async def on_kv_events(self, replica: str, events: list[Any]) -> None:
        self.scheduler.on_kv_events(replica, events)
        rs = self.registry.replicas.get(replica)
        if rs is not None:
            rs.kv_events_live = True
        stored_blocks = getattr(self.scheduler, "stored_blocks", None)
        if stored_blocks is not None and self.registry.prefilling(replica):
            if self.registry.blocks_stored(replica, stored_blocks(replica, events)) and self._waiting:
                self.pump()  # a prefill began: calls held for it (the prefill gate) may go

    async def on_resync(self, replica: str) -> None:
        self.scheduler.clear_replica(replica)
