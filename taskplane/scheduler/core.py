"""The Scheduler: one pure, synchronous decision per call, shared by the gateway and the
virtual-time cluster simulator.

State in (a ``CallRequest`` and the replicas as ``ReplicaView`` plain data), decision out.
The stateful parts — KV index, session pins, admission queues, latency calibration,
response cache, round-robin cursors — are plain objects held here and advanced only by
explicit calls carrying the time (``now_s``); the core never reads a clock to decide.

Driving it (both the asyncio gateway and the discrete-event simulator):

* ``decide(call, replicas, now_s)`` -> PLACE (send it), QUEUE (admission holds it),
  SHED (429 + Retry-After), UNMEETABLE (504) or NO_REPLICA (503);
* ``release(replicas, now_s)`` whenever capacity may have freed (a call finished, a
  replica joined) and after a QUEUE: returns ``(call, decision)`` for queued calls that
  are now placed, shed or past their deadline;
* ``observe_completion(call, outcome, now_s)`` when a placed call ends;
* ``on_kv_events(replica, events, seq=...)`` for every KV event batch;
* ``replica_failed`` / ``replica_removed`` when the fleet changes.

``ReplicaView`` counts must include calls already placed (the caller's in-flight
bookkeeping); within one ``release`` pass the scheduler accounts for its own placements.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from taskplane.scheduler.admission import AdmissionQueue, AdmissionSettings, band_rank
from taskplane.scheduler.framework import (
    REGISTRY,
    CycleState,
    Filter,
    Kind,
    OneCandidate,
    Picker,
    Scorer,
    any_true,
)
from taskplane.scheduler.kvindex import BatchResult, KVIndex
from taskplane.scheduler.latency import LatencyModel
from taskplane.scheduler.metrics import (
    DECISION_SECONDS,
    DECISIONS,
    MOVED,
    PLACEMENTS,
    QUEUE_DEPTH,
    SHED,
)
from taskplane.scheduler.response_cache import ResponseCache
from taskplane.scheduler.sessions import SessionPins
from taskplane.scheduler.table import ReplicaTable, as_table
from taskplane.scheduler.tenants import TenantPolicy, tenant_table
from taskplane.scheduler.types import Action, CallOutcome, CallRequest, Decision, ReplicaView
from taskplane.scheduler.workflow import task_value

_MAX_STASH = 200_000


class Scheduler:
    """Filters -> weighted scorers -> picker, plus admission, pins and the KV index."""

    def __init__(
        self,
        *,
        name: str = "custom",
        filters: Sequence[Filter] = (),
        scorers: Sequence[Scorer] = (),
        picker: Picker | None = None,
        seed: int = 0,
        admission: AdmissionSettings | None = None,
        response_cache_entries: int = 0,
        sticky: bool = False,
        tenants: Iterable[Any] | Mapping[str, TenantPolicy] | None = None,
        fallbacks: Mapping[str, str] | None = None,
        kv_index: KVIndex | None = None,
        latency: LatencyModel | None = None,
        sessions: SessionPins | None = None,
        metrics: bool = True,
    ) -> None:
        self.name = name
        self.filters = list(filters)
        self.scorers = list(scorers)
        if picker is None:
            picker = REGISTRY.build(Kind.PICKER, "max-score", policy=name)  # type: ignore[assignment]
        self.picker: Picker = picker  # type: ignore[assignment]
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.admission = admission
        self.sticky = sticky  # decide a pinned session's call over its replica first
        self.saturation_waiting = admission.max_waiting_per_replica if admission else 2
        self.response_cache = ResponseCache(response_cache_entries) if response_cache_entries > 0 else None
        self.tenants: dict[str, TenantPolicy] = (
            dict(tenants) if isinstance(tenants, Mapping) else tenant_table(tenants)
        )
        self.fallbacks = dict(fallbacks or {})
        self.kv_index = kv_index or KVIndex(metrics=metrics)
        self.latency = latency or LatencyModel()
        uses_sessions = any(s.type_name == "session-affinity" for s in self.scorers)
        self.sessions = sessions if sessions is not None else (
            SessionPins(policy=name, metrics=metrics) if uses_sessions else None
        )
        self.metrics = metrics
        self._queues: dict[str, AdmissionQueue] = {}
        self._displaced: list[tuple[CallRequest, Decision]] = []
        self._stash: dict[Any, tuple[str, float, float, str | None]] = {}
        # which plugins read the KV index, and through which source
        sources = {
            getattr(p.params, "source", None)
            for p in [*self.filters, *self.scorers, self.picker]
            if p.type_name in ("prefix-cache", "dynamo-cost", "sglang-cache-aware")
        }
        self._record_always = "approximate" in sources
        self._record_unsynced = bool(sources - {None})
        self._decisions = {a: DECISIONS.labels(name, a.value) for a in Action}
        self._depth_gauges: dict[str, dict[str, Any]] = {}
        self._seconds = DECISION_SECONDS.labels(name)

    # ------------------------------------------------------------------ config

    @classmethod
    def from_config(
        cls,
        config: Any,
        *,
        tenants: Iterable[Any] | None = None,
        pools: Iterable[Any] | None = None,
        name: str | None = None,
        metrics: bool = True,
    ) -> Scheduler:
        """Build from ``taskplane.config.SchedulerConfig`` (or a mapping of its fields)."""
        from taskplane.scheduler.policies import scheduler_from_config

        return scheduler_from_config(config, tenants=tenants, pools=pools, name=name, metrics=metrics)

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

    @staticmethod
    def _pool(table: ReplicaTable, model: str, avoid: tuple[str, ...]) -> np.ndarray:
        rows = table.pool(model)
        if avoid and len(rows):
            names = table.names
            rows = rows[np.fromiter((names[i] not in avoid for i in rows), dtype=bool, count=len(rows))]
        return rows

    def _filter(self, state: CycleState) -> str | None:
        """Run the filters; the name of the one that left no candidate, else None."""
        for f in self.filters:
            keep = f.filter(state)
            if keep is None:
                continue
            dropped = state.narrow(keep)
            if dropped:
                if self.metrics:
                    f._filtered.inc(dropped)
                if len(state.sel) == 0:
                    return f.name
        return None

    def _decide(self, req: CallRequest, replicas: ReplicaTable, now: float) -> Decision:
        fb_model = self.fallbacks.get(req.model) if req.allow_fallback else None
        pool = self._pool(replicas, req.model, req.avoid_replicas)
        if not len(pool):
            if fb_model:
                moved = self._move(req, replicas, now, fb_model, f"no replica serves {req.model}")
                if moved is not None:
                    return moved
            return Decision(Action.NO_REPLICA, reason=f"no replica serves model {req.model!r}")
        if self.sticky and self.sessions is not None:
            kept = self._decide_pinned(req, replicas, now)
            if kept is not None:
                return kept
        state = CycleState(self, req, replicas, pool, now, req.model)
        emptied = self._filter(state)
        if emptied is not None:
            if fb_model:
                moved = self._move(req, replicas, now, fb_model, f"filter {emptied} removed every replica")
                if moved is not None:
                    return moved
            return Decision(Action.NO_REPLICA, reason=f"filter {emptied!r} removed every replica of {req.model!r}")
        budget = req.budget_ms
        if budget is not None and self.admission is not None:  # baselines ignore deadlines
            pred = state.prediction
            best_now = state.fastest_total
            if best_now > budget:
                best_empty = float(state.c(pred.empty_total_ms).min())
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
        return self._place(state)

    def _decide_pinned(self, req: CallRequest, replicas: ReplicaTable, now: float) -> Decision | None:
        """Sticky sessions: a call whose session has a live pin is decided over its pinned
        replica alone — same filters, budget check, admission and scorers — and stays there
        when that replica can take it; otherwise (filtered out, over budget, saturated,
        queue ahead) None sends it through the whole pool. Most agent calls continue a
        session, so their decision costs the same at 10 or 10,000 replicas."""
        pins = self.sessions
        assert pins is not None
        name = pins.get(req.session_id or req.task_id, now)
        if name is None:
            return None
        row = replicas.row_of(name)
        # in the pool: serves the model and is not to be avoided (what _pool selects)
        if row is None or replicas.views[row].model != req.model or name in req.avoid_replicas:
            return None
        one = OneCandidate(self, req, replicas, row, now)
        for f in self.filters:
            if not f.keeps(one):
                if self.metrics:
                    f._filtered.inc(1)
                return None
        if req.budget_ms is not None and self.admission is not None:
            if one.prediction.total_ms > req.budget_ms:
                return None
        if self.admission is not None:
            if one.saturated:
                return None
            if not settings_ws(self.admission) and self.queue_for(req.model).has_at_or_above(band_rank(req.priority)):
                return None
        return self._place_one(one)

    # ------------------------------------------------------------------ move

    def _move(
        self, req: CallRequest, replicas: ReplicaTable, now: float, model: str, why: str
    ) -> Decision | None:
        """Place on the fallback model when it can serve (within budget, if any)."""
        pool = self._pool(replicas, model, req.avoid_replicas)
        if not len(pool):
            return None
        state = CycleState(self, req, replicas, pool, now, model)
        if self._filter(state) is not None:
            return None
        if req.budget_ms is not None and state.fastest_total > req.budget_ms:
            return None
        if self.admission is not None:
            free = ~state.c(state.saturated)
            if not any_true(free):
                return None
            state.narrow(free)
        decision = self._place(state)
        decision.reason = f"moved to fallback {model!r}: {why}"
        if self.metrics:
            MOVED.labels(self.name, model).inc()
        return decision

    # ------------------------------------------------------------------ admission

    def queue_for(self, model: str) -> AdmissionQueue:
        q = self._queues.get(model)
        if q is None:
            settings = self.admission or AdmissionSettings()
            q = self._queues[model] = AdmissionQueue(
                model, weight_of=self._tenant_weight, fair_unit=settings.fair_unit
            )
        return q

    def _tenant_weight(self, tenant: str) -> float:
        t = self.tenants.get(tenant)
        return t.weight if t is not None else 1.0

    def _admit(self, state: CycleState, now: float) -> Decision | None:
        """None: go ahead (candidates narrowed to unsaturated replicas); else QUEUE/SHED."""
        req = state.request
        queue = self.queue_for(state.model)
        band = band_rank(req.priority)
        free = ~state.c(state.saturated)
        n_free = int(np.count_nonzero(free))
        room = state.room
        if room is not None and not any_true(state.c(room)):
            # no replica can hold this new task's context next to the sessions in flight:
            # refuse it now (it has spent nothing) rather than let it evict theirs
            settings = self.admission or AdmissionSettings()
            return self._shed(req, "working_set", settings.working_set_retry_after_s,
                              "no replica has KV room for a new task next to the sessions in flight")
        pinned = state.pinned
        if (
            pinned >= 0
            and settings_ws(self.admission)
            and not bool(state.saturated[pinned])
            and state.candidate_position(pinned) >= 0
        ):
            # a session in flight already holds its KV room: it never waits behind new tasks
            state.narrow(free, n_free)
            return None
        if n_free and not queue.has_at_or_above(band):
            state.narrow(free, n_free)
            return None
        return self._enqueue(state, queue, band, now)

    def _enqueue(self, state: CycleState, queue: AdmissionQueue, band: int, now: float) -> Decision:
        settings = self.admission or AdmissionSettings()
        req = state.request
        pred = state.prediction
        total_s = np.maximum(state.c(pred.total_ms), 1.0) / 1000.0
        drain_per_s = float(np.sum((state.c(state.running) + 1.0) / total_s))
        wait_s = (queue.ahead(band) + 1) / max(drain_per_s, 1e-9)
        service_s = float(state.c(pred.empty_total_ms).min()) / 1000.0
        band_name = req.priority if req.priority in settings.shed_bands else None
        if req.budget_ms is not None and wait_s + service_s > req.budget_ms / 1000.0 and band_name:
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
                self._displaced.append(
                    (victim.call, self._shed(victim.call, "displaced", wait_s, "admission queue full: displaced by more urgent work"))
                )
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

    def release(
        self, replicas: ReplicaTable | Sequence[ReplicaView], now_s: float
    ) -> list[tuple[CallRequest, Decision]]:
        """Hand out queued calls that can go now, in admission order.

        Returns ``(call, decision)`` pairs: PLACE for calls released to a replica, SHED for
        calls displaced from a full queue, UNMEETABLE for calls that can no longer finish by
        their deadline, NO_REPLICA for calls whose pool vanished.
        """
        out = self._displaced
        self._displaced = []
        table: ReplicaTable | None = None
        for model, queue in self._queues.items():
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
                pool = self._pool(table, model, req.avoid_replicas)
                if not len(pool):
                    queue.pop()
                    out.append((req, Decision(Action.NO_REPLICA, reason=f"no replica serves model {model!r}")))
                    continue
                state = CycleState(self, req, table, pool, now_s, model)
                if self._filter(state) is not None:
                    queue.pop()
                    out.append((req, Decision(Action.NO_REPLICA, reason="every replica was filtered out")))
                    continue
                free = ~state.c(state.saturated)
                if not any_true(free):
                    room = state.room
                    if room is not None and not any_true(state.c(room)):
                        # a new task waiting for working-set room would block the line
                        queue.pop()
                        settings = self.admission or AdmissionSettings()
                        out.append((req, self._shed(req, "working_set", settings.working_set_retry_after_s,
                                                    "no replica has KV room for a new task")))
                        continue
                    break  # head of line waits for capacity
                state.narrow(free)
                decision = self._place(state)
                queue.pop()
                out.append((req, decision))
                if self.metrics:
                    self._decisions[Action.PLACE].inc()
                self._account(table, state, decision)
            self._update_depth(queue)
        return out

    @staticmethod
    def _account(table: ReplicaTable, state: CycleState, decision: Decision) -> None:
        """Reflect a placement in this pass's private copy of the table."""
        name = decision.replica
        if name is None:
            return
        j = state.position_of(name)
        r = state.view(j)
        table.update(
            name,
            num_waiting=r.num_waiting + 1,
            kv_blocks_free=max(r.kv_blocks_free - int(state.new_blocks_needed()[j]), 0),
            inflight_prefill_tokens=r.inflight_prefill_tokens + int(state.uncached_tokens()[j]),
            inflight_decode_tokens=r.inflight_decode_tokens + state.request.max_tokens,
        )

    def cancel(self, request: CallRequest) -> bool:
        """Drop a queued call (its client went away)."""
        for queue in self._queues.values():
            if queue.remove(request) is not None:
                self._update_depth(queue)
                return True
        return False

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    @property
    def pending(self) -> bool:
        """Can ``release`` hand anything out (calls queued, or displaced from a full queue)?"""
        return bool(self._displaced) or any(len(q) for q in self._queues.values())

    def queue_depths(self) -> dict[str, dict[str, int]]:
        """Queued calls per pool and priority band."""
        return {model: q.depths() for model, q in self._queues.items()}

    # ------------------------------------------------------------------ place

    def _place(self, state: CycleState) -> Decision:
        """Score the candidates and pick one. A single candidate (a pinned session's
        replica, a pool of one) is a forced choice: it is not scored, which is most of the
        cost of a continuing call's decision."""
        n = len(state.sel)
        totals: np.ndarray | None = None
        scored: list[tuple[Scorer, np.ndarray]] = []
        if n > 1:
            for scorer in self.scorers:
                s = scorer.score(state)
                weight = scorer.weight
                if weight:
                    term = s if weight == 1.0 else weight * s  # 1.0 * s is s: skip the product
                    if totals is None:
                        totals = term + 0.0  # a copy (term may be shared), as adding it to zeros gives
                    else:
                        totals += term
                scored.append((scorer, s))
        if totals is None:
            totals = np.zeros(n)
        pos = self.picker.pick(state, totals) if n > 1 else 0
        i = int(state.sel[pos])
        view = state.view(i)
        scores = {scorer.name: float(s[pos]) for scorer, s in scored}
        if scored:
            scores["total"] = float(totals[pos])
        if self.metrics:
            for scorer, s in scored:
                scorer._hist.observe(float(s[pos]))
            PLACEMENTS.labels(self.name, view.name).inc()
        moved = self._pin(state, i, view)
        self._remember(state.request, view)
        matched = state._matched.get("auto")
        pred = state._prediction
        return Decision(
            Action.PLACE,
            replica=view.name,
            model=state.model,
            gpu=view.gpu,
            cached_blocks=int(matched[i]) if matched is not None else 0,
            predicted_ttft_ms=float(pred.ttft_ms[i]) if pred is not None else None,
            predicted_total_ms=float(pred.total_ms[i]) if pred is not None else None,
            predicted_queue_ms=float(pred.queue_ms[i]) if pred is not None else None,
            scores=scores,
            session_moved=moved,
        )

    def _place_one(self, one: OneCandidate) -> Decision:
        """``_place`` for a session kept on its pinned replica: a forced choice, not scored."""
        view, req = one.view, one.request
        if self.metrics:
            PLACEMENTS.labels(self.name, view.name).inc()
        session = req.session_id or req.task_id
        assert self.sessions is not None
        self.sessions.placed(session, view.name, one.now_s, req.agent, tokens=int(req.prompt_tokens + one.completion_tokens))
        self._remember(req, view)
        pred = one._prediction
        return Decision(
            Action.PLACE,
            replica=view.name,
            model=one.model,
            gpu=view.gpu,
            cached_blocks=int(one._matched) if one._matched is not None else 0,
            predicted_ttft_ms=pred.ttft_ms if pred is not None else None,
            predicted_total_ms=pred.total_ms if pred is not None else None,
            predicted_queue_ms=pred.queue_ms if pred is not None else None,
            scores={},
        )

    def _pin(self, state: CycleState, i: int, view: ReplicaView) -> bool:
        """Update the session's pin; True when the session left its pinned replica."""
        pins = self.sessions
        req = state.request
        session = req.session_id or req.task_id
        if pins is None or session is None:
            return False
        pinned = state.pinned
        name = state.pinned_name
        moved = False
        if name is not None and name != view.name:
            if pinned < 0:
                reason = "removed"
            elif not bool(state.healthy[pinned]):
                reason = "failed"
            elif self.admission is not None and bool(state.saturated[pinned]):
                reason = "saturated"
            elif state.candidate_position(pinned) < 0:
                reason = "filtered"
            else:
                reason = "outscored"
            pins.break_pin(session, reason)
            moved = True
        pins.placed(session, view.name, state.now_s, req.agent, tokens=int(req.prompt_tokens + state.completion_tokens))
        return moved

    def _remember(self, req: CallRequest, view: ReplicaView) -> None:
        if req.block_hashes and (
            self._record_always
            or not req.tokenized
            or (self._record_unsynced and not self.kv_index.precise.in_sync(view.name))
        ):
            self.kv_index.record_routing(view.name, req.block_hashes, view.kv_blocks_total)
        key = req.call_id or id(req)
        if len(self._stash) >= _MAX_STASH:
            self._stash.pop(next(iter(self._stash)))
        self._stash[key] = (view.gpu, self.latency.queued_tokens(view), float(view.num_running + 1), view.name)

    # ------------------------------------------------------------------ feedback

    def observe_completion(self, request: CallRequest, outcome: CallOutcome, now_s: float) -> None:
        """A placed call ended: calibrate the latency model, start the session's tool gap."""
        stash = self._stash.pop(request.call_id or id(request), None)
        gpu = outcome.gpu or (stash[0] if stash else None)
        queued = stash[1] if stash else 0.0
        batch = float(outcome.batch_size) if outcome.batch_size else (stash[2] if stash else 1.0)
        if gpu is not None and outcome.ok:
            ttft = outcome.ttft_s
            if ttft is not None and outcome.cold_start_s:
                ttft = max(ttft - outcome.cold_start_s, 0.0)
            decode_s = (
                outcome.total_s - outcome.ttft_s
                if outcome.total_s is not None and outcome.ttft_s is not None
                else None
            )
            self.latency.observe(
                gpu,
                model=request.model,
                prefill_tokens=queued + max(outcome.prompt_tokens - outcome.cached_tokens, 0),
                ttft_s=ttft,
                completion_tokens=outcome.completion_tokens,
                decode_s=decode_s,
                batch_size=batch,
                cold_start_s=outcome.cold_start_s,
                prompt_tokens=outcome.prompt_tokens or None,
            )
        if self.sessions is not None:
            session = request.session_id or request.task_id
            if session is not None:
                if not outcome.ok:
                    self.sessions.break_pin(session, "failed")
                elif request.steps_remaining == 0:
                    self.sessions.end(session)  # the task's last step: its context is done with
                else:
                    self.sessions.finished(session, now_s)

    def on_kv_events(self, replica: str, events: Iterable[Any], seq: int | None = None) -> BatchResult | None:
        """Feed one batch of a replica's KV events (``seq``: the ZMQ sequence number)."""
        if seq is None:
            self.kv_index.apply_events(replica, events)
            return None
        return self.kv_index.apply_batch(replica, seq, events)

    def clear_replica(self, replica: str) -> None:
        """Missed KV events that cannot be replayed: forget what the replica holds."""
        self.kv_index.clear_replica(replica)

    def replica_failed(self, replica: str) -> int:
        """A replica failed: break its session pins (they move to the best overlap)."""
        return self.sessions.drop_replica(replica, "failed") if self.sessions else 0

    def replica_removed(self, replica: str) -> None:
        """A replica left the pool: drop its KV state and pins."""
        self.kv_index.remove_replica(replica)
        if self.sessions is not None:
            self.sessions.drop_replica(replica, "removed")


def settings_ws(settings: AdmissionSettings | None) -> bool:
    """Is working-set admission on?"""
    return settings is not None and bool(settings.working_set_limits)


def describe_decision(d: Decision) -> str:
    """One line for logs."""
    parts = [d.action.value]
    if d.replica:
        parts.append(f"replica={d.replica}")
    if d.model:
        parts.append(f"model={d.model}")
    if d.retry_after_s is not None:
        parts.append(f"retry_after={d.retry_after_s:g}s")
    if d.predicted_total_ms is not None and math.isfinite(d.predicted_total_ms):
        parts.append(f"predicted={d.predicted_total_ms:.0f}ms")
    if d.reason:
        parts.append(d.reason)
    return " ".join(parts)
