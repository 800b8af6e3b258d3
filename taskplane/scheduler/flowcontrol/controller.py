"""Flow control: decides whether a call is placed now, and composes the pipeline to place it.

State in (a ``CallRequest`` and the replicas as ``ReplicaView`` plain data), decision out,
with explicit times: the core never reads a clock to decide. Driving it (both the asyncio
gateway and the discrete-event simulator):

* ``decide(call, replicas, now_s)`` -> PLACE (send it), QUEUE (admission holds it),
  SHED (429 + Retry-After), UNMEETABLE (504) or NO_REPLICA (503);
* ``release(replicas, now_s)`` whenever capacity may have freed (a call finished, a
  replica joined) and after a QUEUE: returns ``(call, decision)`` for queued calls that
  are now placed, shed or past their deadline;
* ``observe_completion(call, outcome, now_s)`` when a placed call ends;
* ``on_kv_events(replica, events, seq=...)`` for every KV event batch;
* ``replica_failed`` / ``replica_removed`` when the fleet changes.

Around the pipeline (:class:`taskplane.scheduler.core.Scheduler`) it adds what a pipeline
must not know: the fallback model a call may move to, the deadline check, and admission
(priority bands, fair share, EDF, shedding, working-set room) with a queue per pool.
``ReplicaView`` counts must include calls already placed (the caller's in-flight
bookkeeping); within one ``release`` pass flow control accounts for its own placements.
Without admission settings (the baselines) every call the pipeline can place is placed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from taskplane.scheduler.core import Scheduler
from taskplane.scheduler.flowcontrol.assembly import assemble_from_config
from taskplane.scheduler.flowcontrol.backlog import below_backlog
from taskplane.scheduler.flowcontrol.gate import PrefillGate, waiting_prefill
from taskplane.scheduler.flowcontrol.queue import AdmissionQueue
from taskplane.scheduler.flowcontrol.settings import AdmissionSettings, band_rank
from taskplane.scheduler.flowcontrol.workingset import working_set_on
from taskplane.scheduler.framework.handle import SessionsView
from taskplane.scheduler.framework.normalise import any_true
from taskplane.scheduler.framework.plugin import Filter
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.kv.precise import BatchResult
from taskplane.scheduler.kvindex import KVIndex
from taskplane.scheduler.latency import LatencyModel
from taskplane.scheduler.metrics import (
    BACKLOG_HELD,
    DECISION_SECONDS,
    DECISIONS,
    GATE_HELD,
    MOVED,
    QUEUE_DEPTH,
    SHED,
)
from taskplane.scheduler.response_cache import ResponseCache
from taskplane.scheduler.table import ReplicaTable, as_table
from taskplane.scheduler.types import Action, CallOutcome, CallRequest, Decision, ReplicaView
from taskplane.scheduler.workflow import task_value


class FlowControl:
    """Admission, fallback moves and deadlines around one placement pipeline."""

    def __init__(
        self,
        pipeline: Scheduler,
        *,
        admission: AdmissionSettings | None = None,
        fallbacks: Mapping[str, str] | None = None,
        response_cache_entries: int = 0,
    ) -> None:
        self.pipeline = pipeline
        self.name = pipeline.name
        self.metrics = pipeline.metrics
        self.admission = admission
        self.fallbacks = dict(fallbacks or {})
        self.response_cache = ResponseCache(response_cache_entries) if response_cache_entries > 0 else None
        self._queues: dict[str, AdmissionQueue] = {}
        # new tasks held for working-set room, apart so they never block the line of the rest
        self._room_queues: dict[str, AdmissionQueue] = {}
        self._displaced: list[tuple[CallRequest, Decision]] = []
        # pinned calls held until their replica's in-flight prefill is done (serial_prefill)
        self._gate = PrefillGate()
        self._decisions = {a: DECISIONS.labels(self.name, a.value) for a in Action}
        self._depth_gauges: dict[str, dict[str, Any]] = {}
        self._seconds = DECISION_SECONDS.labels(self.name)
        # filters that may send a pinned session's call to the pool (most pipelines: none)
        self._pin_releasers = [f for f in pipeline.filters if type(f).releases_pin is not Filter.releases_pin]

    @classmethod
    def from_config(
        cls,
        config: Any,
        *,
        tenants: Iterable[Any] | None = None,
        pools: Iterable[Any] | None = None,
        name: str | None = None,
        metrics: bool = True,
    ) -> FlowControl:
        """Build from ``taskplane.config.SchedulerConfig`` (or a mapping of its fields)."""
        return cls(**assemble_from_config(config, tenants=tenants, pools=pools, name=name, metrics=metrics))

    # what the pipeline holds, for callers that read it (tests, tools, the bench)
    @property
    def kv_index(self) -> KVIndex:
        return self.pipeline.kv_index

    @property
    def latency(self) -> LatencyModel:
        return self.pipeline.latency

    @property
    def sessions(self) -> SessionsView | None:
        return self.pipeline.handle.sessions

    # ------------------------------------------------------------------ decide

    def decide(
        self, request: CallRequest, replicas: ReplicaTable | Sequence[ReplicaView], now_s: float | None = None
    ) -> Decision:
        """Place, queue or refuse one call. ``now_s`` defaults to ``request.now_s``.

        ``replicas``: every replica the caller knows (any model), as a list of views or,
        for large fleets, a ``ReplicaTable`` the caller keeps up to date.
        """
        t0 = time.perf_counter() if self.metrics else 0.0
        now = request.now_s if now_s is None else now_s
        decision = self._decide(request, as_table(replicas), now)
        if self.metrics:
            self._decisions[decision.action].inc()
            self._seconds.observe(time.perf_counter() - t0)
        return decision

    def _decide(self, req: CallRequest, replicas: ReplicaTable, now: float) -> Decision:
        pipe = self.pipeline
        fb_model = self.fallbacks.get(req.model) if req.allow_fallback else None
        pool = pipe.pool(replicas, req.model, req.avoid_replicas)
        if not len(pool):
            if fb_model:
                moved = self._move(req, replicas, now, fb_model, f"no replica serves {req.model}")
                if moved is not None:
                    return moved
            return Decision(Action.NO_REPLICA, reason=f"no replica serves model {req.model!r}")
        kept = self._decide_pinned(req, replicas, now)
        if kept is not None:
            return kept
        state = pipe.state(req, replicas, pool, now, req.model)
        emptied = pipe.filter(state)
        if emptied is not None:
            if fb_model:
                moved = self._move(req, replicas, now, fb_model, f"filter {emptied} removed every replica")
                if moved is not None:
                    return moved
            return Decision(Action.NO_REPLICA, reason=f"filter {emptied!r} removed every replica of {req.model!r}")
        budget = req.budget_ms
        if budget is not None and self.admission is not None:  # baselines ignore deadlines
            best_now = state.fastest_total
            if best_now > budget:
                best_empty = float(state.c(state.prediction.empty_total_ms).min())
                if fb_model:
                    why = f"{req.model} predicted {best_now:.0f} ms > budget {budget:.0f} ms"
                    moved = self._move(req, replicas, now, fb_model, why)
                    if moved is not None:
                        return moved
                if best_empty > budget:
                    return Decision(
                        Action.UNMEETABLE,
                        model=req.model,
                        predicted_total_ms=best_empty,
                        reason=(
                            f"budget {budget:.0f} ms is below the fastest possible "
                            f"{best_empty:.0f} ms for {req.model!r} even on an idle replica"
                        ),
                    )
        if self.admission is not None:
            held = self._admit(state, now)
            if held is not None:
                return held
        return self._gated(req, pipe.place(state), replicas, now)

    def _gated(self, req: CallRequest, decision: Decision, replicas: ReplicaTable, now: float) -> Decision:
        """With ``serial_prefill``: a placement on a replica with prompt tokens in flight (or
        calls already waiting for it) waits in that replica's line of the prefill gate, and
        the caller is told QUEUE; ``release`` hands the placement out once the prefill there
        is done (flowcontrol/gate.py)."""
        name = decision.replica
        settings = self.admission
        if settings is None or not settings.serial_prefill or name is None:
            return decision
        if len(replicas.pool(decision.model or req.model)) < settings.serial_prefill_min_replicas:
            return decision
        if req.prompt_tokens - decision.cached_blocks * req.block_size < settings.serial_prefill_min_tokens:
            return decision  # a short prefill shares the engine's step at little cost
        view = replicas.get(name)
        if view is None or (waiting_prefill(view) <= 0 and not self._gate.holds(name)):
            return decision
        self._gate.hold(req, decision, now)
        if self.metrics:
            GATE_HELD.labels(self.name).inc()
        return Decision(Action.QUEUE, model=decision.model, predicted_queue_ms=decision.predicted_queue_ms,
                        reason=f"held until the prefill in flight on {name} is done")

    def _decide_pinned(self, req: CallRequest, replicas: ReplicaTable, now: float) -> Decision | None:
        """A call whose session has a live pin is decided over its pinned replica alone --
        same filters, budget check, admission and scorers -- and stays there when that
        replica can take it; otherwise (no pin, filtered out, over budget, saturated, queue
        ahead) None sends it through the whole pool."""
        one = self.pipeline.pinned_candidate(req, replicas, now)
        if one is None or (self._pin_releasers and any(f.releases_pin(one) for f in self._pin_releasers)):
            return None
        if self.admission is not None:
            if req.budget_ms is not None and one.prediction.total_ms > req.budget_ms:
                return None
            if one.saturated:
                return None
            if not working_set_on(self.admission) and self.queue_for(req.model).has_at_or_above(
                band_rank(req.priority)
            ):
                return None
        return self._gated(req, self.pipeline.place_one(one), replicas, now)

    def _move(self, req: CallRequest, replicas: ReplicaTable, now: float, model: str, why: str) -> Decision | None:
        """Place on the fallback model when it can serve (within budget, if any)."""
        pipe = self.pipeline
        pool = pipe.pool(replicas, model, req.avoid_replicas)
        if not len(pool):
            return None
        state = pipe.state(req, replicas, pool, now, model)
        if pipe.filter(state) is not None:
            return None
        if req.budget_ms is not None and state.fastest_total > req.budget_ms:
            return None
        if self.admission is not None:
            free = ~state.c(state.saturated)
            if not any_true(free):
                return None
            state.narrow(free)
        decision = pipe.place(state)
        decision.reason = f"moved to fallback {model!r}: {why}"
        if self.metrics:
            MOVED.labels(self.name, model).inc()
        return decision

    # ------------------------------------------------------------------ admission

    def queue_for(self, model: str) -> AdmissionQueue:
        q = self._queues.get(model)
        if q is None:
            settings = self.admission or AdmissionSettings()
            q = self._queues[model] = AdmissionQueue(model, weight_of=self._tenant_weight, fair_unit=settings.fair_unit)
        return q

    def room_queue_for(self, model: str) -> AdmissionQueue:
        """The queue of ``model``'s new tasks held for working-set room."""
        q = self._room_queues.get(model)
        if q is None:
            settings = self.admission or AdmissionSettings()
            q = self._room_queues[model] = AdmissionQueue(
                f"{model}#room", weight_of=self._tenant_weight, fair_unit=settings.fair_unit
            )
        return q

    def _all_queues(self) -> list[tuple[str, AdmissionQueue]]:
        return [*self._queues.items(), *self._room_queues.items()]

    def _tenant_weight(self, tenant: str) -> float:
        t = self.pipeline.handle.tenants.get(tenant)
        return t.weight if t is not None else 1.0

    def _admit(self, state: CycleState, now: float) -> Decision | None:
        """None: go ahead (candidates narrowed to unsaturated replicas); else QUEUE/SHED."""
        req = state.request
        settings = self.admission or AdmissionSettings()
        queue = self.queue_for(state.model)
        band = band_rank(req.priority)
        free = ~state.c(state.saturated)
        n_free = int(np.count_nonzero(free))
        room = state.room
        if room is not None and not any_true(state.c(room)):
            if settings.working_set_hold_s <= 0:
                # no replica can hold this new task's context next to the sessions in flight:
                # refuse it now (it has spent nothing) rather than let it evict theirs
                return self._shed(req, "working_set", settings.working_set_retry_after_s,
                                  "no replica has KV room for a new task next to the sessions in flight")
            # hold it apart until room frees (a task ends, a paused pin expires): the calls
            # queued for capacity alone go on past it
            return self._enqueue(state, self.room_queue_for(state.model), band, now)
        pinned = state.pinned
        if (
            pinned >= 0
            and working_set_on(self.admission)
            and not bool(state.saturated[pinned])
            and state.candidate_position(pinned) >= 0
        ):
            # a session in flight already holds its KV room: it never waits behind new tasks
            state.narrow(free, n_free)
            return None
        free, n_free = self._late_binding(state, free, n_free, narrow=False)
        if n_free and not queue.has_at_or_above(band):
            state.narrow(free, n_free)
            return None
        if n_free == 0 and self.metrics and any_true(~state.c(state.saturated)):
            BACKLOG_HELD.labels(self.name).inc()
        return self._enqueue(state, queue, band, now)

    def _late_binding(
        self, state: CycleState, free: np.ndarray, n_free: int, *, narrow: bool = True
    ) -> tuple[np.ndarray, int]:
        """Late binding: ``free`` with no replica left when every one of them is past its
        prefill backlog (the call is held), unless the call's session has a live pin among
        the candidates (its context is there). A call released from the queue (``narrow``)
        goes only to a replica below the backlog; a new call that finds one such replica is
        placed as before, over every free replica."""
        if n_free == 0:
            return free, n_free
        pinned = state.pinned
        if pinned >= 0 and state.candidate_position(pinned) >= 0:
            return free, n_free
        below = below_backlog(state, self.admission)
        if below is None:
            return free, n_free
        kept = free & below
        n_kept = int(np.count_nonzero(kept))
        if n_kept and not narrow:
            return free, n_free
        return kept, n_kept

    def _enqueue(self, state: CycleState, queue: AdmissionQueue, band: int, now: float) -> Decision:
        settings = self.admission or AdmissionSettings()
        req = state.request
        pred = state.prediction
        total_s = np.maximum(state.c(pred.total_ms), 1.0) / 1000.0
        drain_per_s = float(np.sum((state.c(state.running) + 1.0) / total_s))
        wait_s = (queue.ahead(band) + 1) / max(drain_per_s, 1e-9)
        service_s = float(state.c(pred.empty_total_ms).min()) / 1000.0
        sheddable = req.priority in settings.shed_bands
        if req.budget_ms is not None and wait_s + service_s > req.budget_ms / 1000.0 and sheddable:
            return self._shed(
                req,
                "deadline",
                wait_s,
                f"{req.priority} call would wait ~{wait_s:.1f} s for capacity and miss its "
                f"{req.budget_ms:.0f} ms budget",
            )
        if len(queue) >= settings.max_queue:
            victim = queue.victim()
            if victim is not None and (victim.band, -victim.value) > (band, -task_value(req)):
                queue.remove(victim.call)
                shed = self._shed(victim.call, "displaced", wait_s, "admission queue full: displaced by more urgent work")
                self._displaced.append((victim.call, shed))
            else:
                return self._shed(req, "queue_full", wait_s, f"admission queue of {state.model!r} is full")
        queue.push(req, now, service_s=service_s)
        self._update_depth(queue)
        return Decision(
            Action.QUEUE,
            model=state.model,
            predicted_queue_ms=wait_s * 1000.0,
            reason=f"held by admission control ({len(queue)} queued for {state.model!r})",
        )

    def _shed(self, req: CallRequest, reason: str, wait_s: float, message: str) -> Decision:
        settings = self.admission or AdmissionSettings()
        if self.metrics:
            SHED.labels(self.name, req.priority, reason).inc()
        return Decision(Action.SHED, model=req.model, retry_after_s=settings.retry_after(wait_s), reason=message)

    def _update_depth(self, queue: AdmissionQueue) -> None:
        if self.metrics:
            gauges = self._depth_gauges.get(queue.pool)
            if gauges is None:
                gauges = self._depth_gauges[queue.pool] = {
                    band: QUEUE_DEPTH.labels(self.name, queue.pool, band) for band in queue.depths()
                }
            for band, depth in queue.depths().items():
                gauges[band].set(depth)

    # ------------------------------------------------------------------ release

    def release(
        self, replicas: ReplicaTable | Sequence[ReplicaView], now_s: float
    ) -> list[tuple[CallRequest, Decision]]:
        """Hand out queued calls that can go now, in admission order.

        Returns ``(call, decision)`` pairs: PLACE for calls released to a replica, SHED for
        calls displaced from a full queue, UNMEETABLE for calls that can no longer finish by
        their deadline, NO_REPLICA for calls whose pool vanished.
        """
        pipe = self.pipeline
        out = self._displaced
        self._displaced = []
        table: ReplicaTable | None = None
        if len(self._gate):
            table = as_table(replicas).copy() if isinstance(replicas, ReplicaTable) else as_table(replicas)
            out.extend(self._release_gated(table, now_s))
        for model, queue in self._all_queues():
            for entry in queue.expired(now_s):
                d = Decision(
                    Action.UNMEETABLE,
                    model=model,
                    reason=f"deadline can no longer be met after {now_s - entry.enqueued_s:.1f} s in the admission queue",
                )
                out.append((entry.call, d))
                if self.metrics:
                    self._decisions[Action.UNMEETABLE].inc()
            if not len(queue):
                self._update_depth(queue)
                continue
            if table is None:  # a private copy: this pass accounts for its own placements
                table = as_table(replicas).copy() if isinstance(replicas, ReplicaTable) else as_table(replicas)
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
                free = ~state.c(state.saturated)
                free, n_free = self._late_binding(state, free, int(np.count_nonzero(free)))
                if not n_free:
                    if self._held_too_long(state, now_s - head.enqueued_s):
                        # a new task still without working-set room after its hold: refuse
                        # it (it has spent nothing) rather than block the line
                        queue.pop()
                        settings = self.admission or AdmissionSettings()
                        out.append((req, self._shed(req, "working_set", settings.working_set_retry_after_s,
                                                    "no replica has KV room for a new task")))
                        continue
                    break  # head of line waits for capacity
                state.narrow(free, n_free)
                decision = pipe.place(state)
                queue.pop()
                out.append((req, decision))
                if self.metrics:
                    self._decisions[Action.PLACE].inc()
                _account(table, state, decision)
            self._update_depth(queue)
        return out

    def release_gate(
        self, replicas: ReplicaTable | Sequence[ReplicaView], now_s: float
    ) -> list[tuple[CallRequest, Decision]]:
        """Only the prefill gate's part of ``release``: what a first token frees (the
        simulator calls it at each one; the gateway's pump runs ``release`` every 20 ms)."""
        if not len(self._gate):
            return []
        table = as_table(replicas).copy() if isinstance(replicas, ReplicaTable) else as_table(replicas)
        return self._release_gated(table, now_s)

    def _release_gated(self, table: ReplicaTable, now_s: float) -> list[tuple[CallRequest, Decision]]:
        """The head of each prefill-gate line whose replica has no prefill in flight, with
        the placement made when it came."""
        out = []
        assert self.admission is not None  # only serial_prefill holds calls in the gate
        for g in self._gate.ready(table, now_s, self.admission.serial_prefill_max_hold_ms / 1000.0):
            out.append((g.call, g.decision))
            if self.metrics:
                self._decisions[Action.PLACE].inc()
            _account_placed(table, g.call, g.decision)
        return out

    def _held_too_long(self, state: CycleState, held_s: float) -> bool:
        """Has a queued new task waited out its hold without any replica having room?"""
        room = state.room
        if room is None or any_true(state.c(room)):
            return False
        settings = self.admission or AdmissionSettings()
        return held_s >= settings.working_set_hold_s

    def cancel(self, request: CallRequest) -> bool:
        """Drop a queued call (its client went away)."""
        for _, queue in self._all_queues():
            if queue.remove(request) is not None:
                self._update_depth(queue)
                return True
        return self._gate.remove(request)

    def gates_prefill(self, replicas: int) -> bool:
        """Is the prefill gate on (``serial_prefill``) for a pool of ``replicas``? The
        simulator then hands first tokens to ``release_gate``."""
        s = self.admission
        return s is not None and s.serial_prefill and replicas >= s.serial_prefill_min_replicas

    @property
    def queued(self) -> int:
        return sum(len(q) for _, q in self._all_queues()) + len(self._gate)

    @property
    def pending(self) -> bool:
        """Can ``release`` hand anything out (calls queued or gated, or displaced from a full queue)?"""
        return bool(self._displaced) or bool(len(self._gate)) or any(len(q) for _, q in self._all_queues())

    def queue_depths(self) -> dict[str, dict[str, int]]:
        """Queued calls per pool and priority band (held for working-set room included)."""
        out: dict[str, dict[str, int]] = {}
        for model, q in self._all_queues():
            depths = out.setdefault(model, {})
            for band, n in q.depths().items():
                depths[band] = depths.get(band, 0) + n
        for model, bands in self._gate.depths().items():
            depths = out.setdefault(model, {})
            for band, n in bands.items():
                depths[band] = depths.get(band, 0) + n
        return out

    # ------------------------------------------------------------------ feedback (the pipeline's)

    def observe_completion(self, request: CallRequest, outcome: CallOutcome, now_s: float) -> None:
        """A placed call ended: calibrate the latency model, start the session's tool gap."""
        self.pipeline.observe_completion(request, outcome, now_s)

    def on_kv_events(self, replica: str, events: Iterable[Any], seq: int | None = None) -> BatchResult | None:
        """Feed one batch of a replica's KV events (``seq``: the ZMQ sequence number)."""
        return self.pipeline.on_kv_events(replica, events, seq)

    def stored_blocks(self, replica: str, events: Iterable[Any]) -> list[int]:
        """The block hashes (ours) of the GPU blocks a fed batch of KV events stored."""
        return self.pipeline.stored_blocks(replica, events)

    def clear_replica(self, replica: str) -> None:
        """Missed KV events that cannot be replayed: forget what the replica holds."""
        self.pipeline.clear_replica(replica)

    def replica_failed(self, replica: str) -> int:
        """A replica failed: break its session pins (they move to the best overlap)."""
        return self.pipeline.replica_failed(replica)

    def replica_removed(self, replica: str) -> None:
        """A replica left the pool: drop its KV state and pins."""
        self.pipeline.replica_removed(replica)


def _account_placed(table: ReplicaTable, req: CallRequest, decision: Decision) -> None:
    """``_account`` for a placement made without a pool state (a call the gate handed out):
    the call's uncached prompt and new blocks from the decision's cached blocks."""
    name = decision.replica
    r = table.get(name or "")
    if name is None or r is None:
        return
    cached = decision.cached_blocks * req.block_size
    blocks = math.ceil((req.prompt_tokens + req.max_tokens) / max(req.block_size, 1)) - decision.cached_blocks
    _reflect(table, name, r, req, new_blocks=max(blocks, 0), uncached_tokens=max(req.prompt_tokens - cached, 0))


def _account(table: ReplicaTable, state: CycleState, decision: Decision) -> None:
    """Reflect a placement in a release pass's private copy of the table."""
    name = decision.replica
    if name is None:
        return
    j = state.position_of(name)
    _reflect(table, name, state.view(j), state.request, new_blocks=int(state.new_blocks_needed()[j]),
             uncached_tokens=int(state.uncached_tokens()[j]))


def _reflect(
    table: ReplicaTable, name: str, r: ReplicaView, req: CallRequest, *, new_blocks: int, uncached_tokens: int
) -> None:
    """``name`` (as ``r`` saw it) has one more call waiting: its new blocks taken, its prompt and decode in flight."""
    table.update(
        name,
        num_waiting=r.num_waiting + 1,
        kv_blocks_free=max(r.kv_blocks_free - new_blocks, 0),
        inflight_prefill_tokens=r.inflight_prefill_tokens + uncached_tokens,
        inflight_decode_tokens=r.inflight_decode_tokens + req.max_tokens,
    )
