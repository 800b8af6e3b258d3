"""Admission: runs the flow-control plugins (flowcontrol/flowset.py) over one pool's
decision and over the calls they hold. A call the pipeline could place is held when a plugin
says so -- no working-set room (``room``), every replica past its prefill backlog
(``backlog``), capacity saturated or more urgent calls queued -- in a per-pool queue whose
order the ``ordering`` and ``fairness`` plugins give; ``shedding`` refuses what cannot wait;
the ``gate`` holds a placement until its replica's prefill in flight is done.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from taskplane.scheduler.core import Scheduler
from taskplane.scheduler.flowcontrol.flowset import FlowSet
from taskplane.scheduler.flowcontrol.pools import PoolQueues
from taskplane.scheduler.flowcontrol.queue import AdmissionQueue
from taskplane.scheduler.flowcontrol.settings import AdmissionSettings, band_rank
from taskplane.scheduler.flowcontrol.tally import account, account_placed
from taskplane.scheduler.flowcontrol.workingset import Room
from taskplane.scheduler.framework.normalise import any_true
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.metrics import BACKLOG_HELD, DECISIONS, GATE_HELD, SHED
from taskplane.scheduler.table import ReplicaTable, as_table
from taskplane.scheduler.types import Action, CallRequest, Decision, ReplicaView

_DEFAULT = AdmissionSettings()


class Admission:
    """The admission half of flow control: queues per pool, and the plugins that fill them."""

    def __init__(self, pipeline: Scheduler, flow: FlowSet | None) -> None:
        self.pipeline = pipeline
        self.name = pipeline.name
        self.metrics = pipeline.metrics
        self.flow = flow
        if flow is not None:
            for plugin in flow.plugins:
                plugin.bind(pipeline.handle)
            pipeline.handle.load = flow.load()
        self._admission = flow.settings() if flow is not None else None
        self.queues = PoolQueues(self.name, flow, self._tenant_weight, metrics=self.metrics)
        self._displaced: list[tuple[CallRequest, Decision]] = []
        self._placed = DECISIONS.labels(self.name, Action.PLACE.value)
        self._unmeetable = DECISIONS.labels(self.name, Action.UNMEETABLE.value)

    @property
    def admission(self) -> AdmissionSettings | None:
        """The flow-control plugins' settings as one flat record (None: no flow control)."""
        return self._admission

    # ------------------------------------------------------------------ queues

    def _tenant_weight(self, tenant: str) -> float:
        t = self.pipeline.handle.tenants.get(tenant)
        return t.weight if t is not None else 1.0

    def queue_ahead(self, req: CallRequest) -> bool:
        """Must a pinned call leave its replica to queue behind equally urgent calls? (only
        without working-set room: with it, a session in flight never waits behind new tasks)"""
        room = self.flow.room if self.flow is not None else None
        if room is not None and room.on:
            return False
        q = self.queues.capacity.get(req.model)
        return q is not None and q.has_at_or_above(band_rank(req.priority))

    # ------------------------------------------------------------------ decide

    def admit(self, state: CycleState, now: float) -> Decision | None:
        """None: go ahead (candidates narrowed to where the call may go); else QUEUE/SHED."""
        assert self.flow is not None
        req = state.request
        queue = self.queues.for_capacity(state.model)
        band = band_rank(req.priority)
        room = self.flow.room
        if room is not None and room.on and room.blocks(state):
            verdict, _ = room.judge(state, self._drain_wait_s(state, self.queues.for_room(state.model), band))
            if verdict is Room.REFUSE:
                return self._shed(req, "working_set", room.params.retry_after_s,
                                  "no replica has KV room for a new task next to the sessions in flight")
            if verdict is Room.HOLD:  # apart: the calls queued for capacity alone go on past it
                return self._enqueue(state, self.queues.for_room(state.model), band, now)
            free, n_free = room.admit_past(state)
        else:
            free = ~state.c(state.saturated)
            n_free = int(np.count_nonzero(free))
            pinned = state.pinned
            if (pinned >= 0 and room is not None and room.on and not bool(state.saturated[pinned])
                    and state.candidate_position(pinned) >= 0):
                state.narrow(free, n_free)  # a session in flight holds its room: never behind new tasks
                return None
        max_hold_s = math.inf
        backlog = self.flow.backlog
        if backlog is not None and backlog.on:
            free, n_free, max_hold_s = backlog.late_bind(state, free, n_free, queued=False)
        if n_free and not queue.has_at_or_above(band):
            state.narrow(free, n_free)
            return None
        if n_free == 0 and self.metrics and any_true(~state.c(state.saturated)):
            BACKLOG_HELD.labels(self.name).inc()
        return self._enqueue(state, queue, band, now, max_hold_s=max_hold_s)

    def _drain_wait_s(self, state: CycleState, queue: AdmissionQueue, band: int) -> float:
        """The wait of a call joining ``queue``: the calls ahead over the candidates' drain rate."""
        total_s = np.maximum(state.c(state.prediction.total_ms), 1.0) / 1000.0
        drain_per_s = float(np.sum((state.c(state.running) + 1.0) / total_s))
        return (queue.ahead(band) + 1) / max(drain_per_s, 1e-9)

    def _enqueue(self, state: CycleState, queue: AdmissionQueue, band: int, now: float,
                 *, max_hold_s: float = math.inf) -> Decision:
        req = state.request
        wait_s = self._drain_wait_s(state, queue, band)
        service_s = float(state.c(state.prediction.empty_total_ms).min()) / 1000.0
        shed = self.flow.shedding if self.flow is not None else None
        if shed is not None:
            if shed.misses_deadline(req, wait_s, service_s):
                return self._shed(req, "deadline", wait_s, f"{req.priority} call would wait ~{wait_s:.1f} s for "
                                  f"capacity and miss its {req.budget_ms:.0f} ms budget")
            ok, victim = shed.make_room(queue, req, band)
            if victim is not None:
                self._displaced.append((victim.call, self._shed(
                    victim.call, "displaced", wait_s, "admission queue full: displaced by more urgent work")))
            if not ok:
                return self._shed(req, "queue_full", wait_s, f"admission queue of {state.model!r} is full")
        entry = queue.push(req, now, service_s=service_s)
        entry.max_hold_s = max_hold_s
        self.queues.update_depth(queue)
        return Decision(Action.QUEUE, model=state.model, predicted_queue_ms=wait_s * 1000.0,
                        reason=f"held by admission control ({len(queue)} queued for {state.model!r})")

    def _shed(self, req: CallRequest, reason: str, wait_s: float, message: str) -> Decision:
        if self.metrics:
            SHED.labels(self.name, req.priority, reason).inc()
        shed = self.flow.shedding if self.flow is not None else None
        retry = shed.retry_after(wait_s) if shed is not None else _DEFAULT.retry_after(wait_s)
        return Decision(Action.SHED, model=req.model, retry_after_s=retry, reason=message)

    # ------------------------------------------------------------------ the prefill gate

    def gated(self, req: CallRequest, decision: Decision, replicas: ReplicaTable, now: float) -> Decision:
        """A placement on a replica with prompt tokens in flight (or calls already waiting
        for it) waits in that replica's line of the prefill gate: the caller is told QUEUE
        and ``release`` hands the placement out once the prefill there is done."""
        gate = self.flow.gate if self.flow is not None else None
        name = decision.replica
        if gate is None or not gate.params.enabled or name is None or decision.prefill_replica is not None:
            return decision  # (a disaggregated call's prompt is computed elsewhere)
        pool_size = len(replicas.pool(decision.model or req.model))
        if not gate.holds_call(req, decision, replicas.get(name), pool_size):
            return decision
        gate.gate.hold(req, decision, now)
        if self.metrics:
            GATE_HELD.labels(self.name).inc()
        return Decision(Action.QUEUE, model=decision.model, predicted_queue_ms=decision.predicted_queue_ms,
                        reason=f"held until the prefill in flight on {name} is done")

    def gates_prefill(self, replicas: int) -> bool:
        """Is the prefill gate on for a pool of ``replicas``? (the simulator then hands first
        tokens to ``release_gate``)"""
        gate = self.flow.gate if self.flow is not None else None
        return gate is not None and gate.applies(replicas)

    def _held_in_gate(self) -> int:
        gate = self.flow.gate if self.flow is not None else None
        return len(gate.gate) if gate is not None else 0

    # ------------------------------------------------------------------ release

    def release(
        self, replicas: ReplicaTable | Sequence[ReplicaView], now_s: float
    ) -> list[tuple[CallRequest, Decision]]:
        """Hand out held calls that can go now, in admission order.

        Returns ``(call, decision)`` pairs: PLACE for calls released to a replica, SHED for
        calls displaced from a full queue or refused after their hold, UNMEETABLE for calls
        that can no longer finish by their deadline, NO_REPLICA for calls whose pool vanished.
        """
        out = self._displaced
        self._displaced = []
        table: ReplicaTable | None = None
        if self._held_in_gate():
            table = _private(replicas)
            out.extend(self._release_gated(table, now_s))
        for model, queue in self.queues.all():
            for entry in queue.expired(now_s):
                reason = f"deadline can no longer be met after {now_s - entry.enqueued_s:.1f} s in the admission queue"
                out.append((entry.call, Decision(Action.UNMEETABLE, model=model, reason=reason)))
                if self.metrics:
                    self._unmeetable.inc()
            if len(queue):
                if table is None:  # a private copy: this pass accounts for its own placements
                    table = _private(replicas)
                self._drain(model, queue, table, now_s, out)
            self.queues.update_depth(queue)
        return out

    def _drain(self, model: str, queue: AdmissionQueue, table: ReplicaTable, now_s: float,
               out: list[tuple[CallRequest, Decision]]) -> None:
        """Release ``queue``'s calls in order until its head must wait."""
        assert self.flow is not None
        pipe = self.pipeline
        room, backlog = self.flow.room, self.flow.backlog
        room_queue = queue.pool.endswith("#room")
        while len(queue):
            head = queue.peek()
            assert head is not None
            req = head.call
            pool = pipe.pool(table, model, req.avoid_replicas)
            if not len(pool):
                queue.pop()
                out.append((req, Decision(Action.NO_REPLICA, reason=f"no replica serves model {model!r}")))
                continue
            state = pipe.state(req, table, pool, now_s, model)
            if pipe.filter(state) is not None:
                queue.pop()
                out.append((req, Decision(Action.NO_REPLICA, reason="every replica was filtered out")))
                continue
            held_s = now_s - head.enqueued_s
            found_room = False
            if room is not None and room.on and room.blocks(state):
                verdict, _ = room.judge(state, self._drain_wait_s(state, queue, head.band), held_s)
                if verdict is Room.REFUSE:  # still without room after its hold: it has spent nothing
                    queue.pop()
                    out.append((req, self._shed(req, "working_set", room.params.retry_after_s,
                                                "no replica has KV room for a new task")))
                    continue
                if verdict is Room.HOLD:
                    break
                free, n_free = room.admit_past(state)
            else:
                free = ~state.c(state.saturated)
                n_free = int(np.count_nonzero(free))
                found_room = room_queue and room is not None
            if backlog is not None and backlog.on:
                free, n_free, _ = backlog.late_bind(state, free, n_free, queued=True, held_s=held_s,
                                               max_hold_s=head.max_hold_s)
            if not n_free:
                break  # the head of the line waits for capacity
            state.narrow(free, n_free)
            decision = pipe.place(state)
            queue.pop()
            if found_room and room is not None:
                room.observe_wait(held_s)
            out.append((req, decision))
            if self.metrics:
                self._placed.inc()
            account(table, state, decision)

    def release_gate(
        self, replicas: ReplicaTable | Sequence[ReplicaView], now_s: float
    ) -> list[tuple[CallRequest, Decision]]:
        """Only the prefill gate's part of ``release``: what a first token frees (the
        simulator calls it at each one; the gateway's pump runs ``release`` every 20 ms)."""
        if not self._held_in_gate():
            return []
        return self._release_gated(_private(replicas), now_s)

    def _release_gated(self, table: ReplicaTable, now_s: float) -> list[tuple[CallRequest, Decision]]:
        """The head of each prefill-gate line whose replica has no prefill in flight, with
        the placement made when it came."""
        assert self.flow is not None and self.flow.gate is not None
        gate = self.flow.gate
        out = []
        for g in gate.gate.ready(table, now_s, gate.params.max_hold_ms / 1000.0):
            out.append((g.call, g.decision))
            if self.metrics:
                self._placed.inc()
            account_placed(table, g.call, g.decision)
        return out

    def cancel(self, request: CallRequest) -> bool:
        """Drop a held call (its client went away)."""
        for _, queue in self.queues.all():
            if queue.remove(request) is not None:
                self.queues.update_depth(queue)
                return True
        gate = self.flow.gate if self.flow is not None else None
        return gate is not None and gate.gate.remove(request)

    @property
    def queued(self) -> int:
        return self.queues.held() + self._held_in_gate()

    @property
    def pending(self) -> bool:
        """Can ``release`` hand anything out (calls queued or gated, or displaced from a full queue)?"""
        return bool(self._displaced) or bool(self._held_in_gate()) or any(len(q) for _, q in self.queues.all())

    def queue_depths(self) -> dict[str, dict[str, int]]:
        """Held calls per pool and priority band (held for working-set room and in the gate included)."""
        out = self.queues.depths()
        gate = self.flow.gate if self.flow is not None else None
        for model, bands in (gate.gate.depths() if gate is not None else {}).items():
            depths = out.setdefault(model, {})
            for band, n in bands.items():
                depths[band] = depths.get(band, 0) + n
        return out


def _private(replicas: ReplicaTable | Sequence[ReplicaView]) -> ReplicaTable:
    """A copy of the fleet a release pass may update with its own placements."""
    return as_table(replicas).copy() if isinstance(replicas, ReplicaTable) else as_table(replicas)
