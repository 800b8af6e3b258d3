"""The discrete-event cluster simulator: many simulated replicas in virtual time.

The same engine model as the HTTP replica (:class:`~taskplane.sim.engine.SimEngine`) and
the same scheduler core as the gateway run under one event loop: no sockets, no
sleeping, no wall clock. The same inputs and seed give bit-identical records.

This module is the loop and the conversation with the policy; its parts are

- :mod:`taskplane.sim.fleet`: what is simulated (:class:`ClusterSpec`, :class:`ReplicaSpec`);
- :mod:`taskplane.sim.results`: what comes out (:class:`ClusterResult` and its records);
- :mod:`taskplane.sim.policy`: what the simulator uses of a policy (its optional parts);
- :mod:`taskplane.sim.events`: the event queue; :mod:`taskplane.sim.replicas`: the
  engines and the policy's views of them;
- :mod:`taskplane.sim.calls`: the state of each task and call, and what a call becomes
  for the scheduler, the engine and the records; :mod:`taskplane.sim.blocks`: how its
  KV blocks are named;
- :mod:`taskplane.sim.lifecycle`: what follows an attempt (next call, retry, task end);
  :mod:`taskplane.sim.pd_cluster`: the same loop with disaggregated calls (:class:`DisaggSim`).

Admission outcomes: QUEUE holds the call (in the policy when it has ``release``, else
here, in priority then deadline order, offered again whenever capacity frees); SHED is
recorded as an attempt with outcome ``shed`` and retried after ``retry_after_s`` while the
task's deadline allows and attempts remain; UNMEETABLE fails the task
(``failed-deadline``); NO_REPLICA is retried after a second. A replica outage aborts its
calls (recorded as ``error`` / ``replica_error``), which are retried elsewhere.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict
from typing import Any

from taskplane.scheduler.kv.lifetimes import LifetimePlanner
from taskplane.scheduler.types import Action, CallOutcome, Decision, Priority
from taskplane.sim.blocks import block_contents, mix
from taskplane.sim.calls import (
    SimCall,
    TaskState,
    call_record,
    call_request,
    engine_request,
    new_call,
    task_result,
)
from taskplane.sim.events import Event, EventQueue
from taskplane.sim.fleet import ClusterSpec, ReplicaSpec
from taskplane.sim.lifecycle import Lifecycle, fail_call
from taskplane.sim.lifetimes import Lifetimes
from taskplane.sim.lora_plan import Preloads, find_planner, refusal
from taskplane.sim.policy import Policy, PolicyHooks, round_robin
from taskplane.sim.replicas import SimReplicas
from taskplane.sim.requests import Finished, FirstToken, KVEvents
from taskplane.sim.results import EPOCH, CallRecord, ClusterResult, ReplicaResult, TaskResult
from taskplane.sim.workloads.base import Workload
from taskplane.store.records import Outcome, TaskStatus

# the names other code imports from here
__all__ = [
    "EPOCH", "CallRecord", "ClusterResult", "ClusterSim", "ClusterSpec", "Policy", "ReplicaResult", "ReplicaSpec",
    "TaskResult", "block_contents", "mix", "round_robin", "simulate",
]


class ClusterSim:
    """One run of a workload on a cluster under a policy. Call :meth:`run` once."""

    def __init__(
        self,
        cluster: ClusterSpec,
        workload: Workload,
        policy: Policy,
        *,
        seed: int = 0,
        max_attempts: int = 3,
        retry_after_s: float = 1.0,
        requeue_interval_s: float = 0.5,
        until_s: float | None = None,
        kv_lifetimes: LifetimePlanner | None = None,
    ) -> None:
        self.cluster, self.workload, self.seed = cluster, workload, seed
        self.bs = workload.block_size
        self.retry_after_s = retry_after_s
        self.requeue_interval_s = requeue_interval_s
        self.until_s = math.inf if until_s is None else until_s
        self.policy = PolicyHooks(policy)
        # first-token events only for a policy with a prefill gate (it releases calls then)
        self.fleet = SimReplicas(cluster, self.bs, kv_events=self.policy.on_kv is not None,
                                 table=self.policy.wants_table, first_tokens=self.policy.gates(len(cluster.replicas)))
        self.tasks: list[TaskState] = []
        self.events = EventQueue(self._initial_events(), len(self.fleet))
        # the control plane's KV lifetimes across tool gaps (only with KV tiers)
        self.lifetimes = (Lifetimes(kv_lifetimes, self.fleet, self.events, self.bs, self.policy.on_kv is not None,
                                    workload.tasks, cluster.hints)
                          if kv_lifetimes is not None and cluster.tiers.enabled else None)
        planner = find_planner(policy)  # adapter pre-loads by predicted demand (opt-in plugins)
        self.preloads = Preloads(planner, self.fleet) if planner is not None else None
        self.lifecycle = Lifecycle(self.events, max_attempts)
        self.records: list[CallRecord] = []
        self._calls_by_id: dict[str, SimCall] = {}  # calls the policy queued, by call id
        self._own_queue: list[tuple[int, float, int, SimCall]] = []  # (priority, deadline, order, call)
        self._queue_seq = 0
        self._tick_pending = False
        self._now = 0.0
        self._ran = False

    # ---------------------------------------------------------------- loop
    def run(self) -> ClusterResult:
        if self._ran:
            raise RuntimeError("a ClusterSim runs once; build a new one")
        self._ran = True
        while (entry := self.events.pop()) is not None:
            t, kind, _, payload = entry
            if t > self.until_s:
                break
            self._now = t
            match kind:
                case Event.WAKE:
                    if self.events.is_live_wake(entry):
                        self._engine_events(payload, self.fleet.engines[payload].advance(t), t)
                        self._schedule_wake(payload)
                case Event.ARRIVAL:
                    if isinstance(payload, SimCall):  # a retry
                        self._offer(payload, t)
                    else:
                        task, k = payload
                        self._issue(task, k, t)
                case Event.OUTAGE:
                    replica, up = payload
                    self._outage(replica, up, t)
                case Event.TICK:
                    self._tick_pending = False
                    self._release_queued(t)
                case Event.PREFETCH:
                    if self.lifetimes is not None and self.lifetimes.prefetch(payload, t):
                        i = payload.replica
                        self._engine_events(i, self.fleet.engines[i].advance(t), t)
                        self._schedule_wake(i)
                case Event.CONTROL:
                    self._control(payload, t)
                case Event.DEMOTE:
                    if self.lifetimes is not None:
                        self.lifetimes.demote(payload)
        return ClusterResult(
            calls=self.records, tasks=[task_result(task) for task in self.tasks], replicas=self.fleet.results(),
            end_s=self._now, decision_ns=self.policy.decision_ns, policy_calls=len(self.policy.decision_ns),
            kv_lifetimes=asdict(self.lifetimes.counts) if self.lifetimes is not None else {})

    def _control(self, payload: Any, t: float) -> None:
        """A subclass's own event (pushed as ``Event.CONTROL``); the plain cluster has none."""

    def _initial_events(self) -> list[tuple[float, Event, Any]]:
        """The tasks' first arrivals and the outages (the state of each task starts here)."""
        events: list[tuple[float, Event, Any]] = []
        for spec in self.workload.tasks:
            task = TaskState(spec=spec, ctx=spec.prefix_tokens)
            if spec.deadline_s is not None:
                task.deadline_abs = spec.arrival_s + spec.deadline_s
            self.tasks.append(task)
            if not spec.calls:
                task.status, task.finished_s = TaskStatus.SUCCEEDED, spec.arrival_s
                continue
            if spec.open_loop:
                for k, c in enumerate(spec.calls):
                    events.append((c.at_s if c.at_s is not None else spec.arrival_s, Event.ARRIVAL, (task, k)))
            else:
                events.append((spec.arrival_s, Event.ARRIVAL, (task, 0)))
        for i, r in enumerate(self.cluster.replicas):
            for down, up in r.outages:
                events.append((down, Event.OUTAGE, (i, False)))
                if up is not None:
                    events.append((up, Event.OUTAGE, (i, True)))
        return events

    def _schedule_wake(self, i: int) -> None:
        """Arm replica ``i``'s next wake-up (an entry armed earlier goes stale)."""
        self.events.set_wake(i, self.fleet.engines[i].next_event_time())

    # ---------------------------------------------------------------- placing calls
    def _issue(self, task: TaskState, k: int, t: float) -> None:
        """Call ``k`` of a task arrives."""
        if task.status is None:
            if self.lifetimes is not None:
                self.lifetimes.arrived(task, k, t)
            self._offer(new_call(task, k, self.bs), t)

    def _offer(self, call: SimCall, t: float) -> None:
        """Ask the policy where the call goes (first offer of an attempt, or a re-offer)."""
        if call.task.status is not None:
            return
        call.offered_s = t
        call.request = call_request(call, t, self.bs, self.cluster.hints)
        if self.preloads is not None and call.request.adapter:
            self.preloads.maybe_plan(t)
        self._apply(call, self.policy.decide(call.request, self.fleet.for_policy(), t), t)

    def _apply(self, call: SimCall, d: Decision, t: float) -> None:
        a = d.action
        if a == Action.PLACE:
            self._dispatch(call, d, t)
        elif a == Action.QUEUE:
            if self.policy.release_fn is not None:  # the policy hands it out later, by call id
                self._calls_by_id[call.key] = call
            else:
                self._hold(call)
            self._ensure_tick(t)
        elif a == Action.SHED:
            self._record(call, t, Outcome.SHED, "overloaded")
            self.lifecycle.retry_or_fail(call, t, d.retry_after_s or self.retry_after_s, "overloaded")
        elif a == Action.UNMEETABLE:
            self._record(call, t, Outcome.ERROR, "deadline_unmeetable")
            fail_call(call, t, "deadline_unmeetable")
        else:  # NO_REPLICA
            self._record(call, t, Outcome.ERROR, "no_replica")
            self.lifecycle.retry_or_fail(call, t, 1.0, "no_replica")

    def _dispatch(self, call: SimCall, d: Decision, t: float) -> None:
        i = self.fleet.find(d.replica)
        if i is None:
            raise ValueError(f"policy placed a call on unknown replica {d.replica!r}")
        call.replica = i
        call.dispatched_s = t
        call.model_served = d.model or call.task.spec.model
        error = "replica_error" if not self.fleet.healthy[i] else refusal(self.fleet.engines[i], call.task.spec.adapter)
        if error:
            self._record(call, t, Outcome.ERROR, error, replica=i)
            self.lifecycle.retry_or_fail(call, t, 0.0, error, avoid=self.fleet.name(i))
            return
        self._submit(call, d, i, t)

    def _submit(self, call: SimCall, d: Decision, i: int, t: float) -> None:
        """Send the placed call to replica ``i``'s engine (taskplane.sim.pd: its prefill replica first)."""
        self.fleet.engines[i].submit(engine_request(call, self.bs, with_tokens=self.policy.on_kv is not None), t)
        self.fleet.mark(i)
        self._schedule_wake(i)

    # ---------------------------------------------------------------- engine events
    def _engine_events(self, i: int, events: list[Any], t: float) -> None:
        if not events:
            return
        self.fleet.mark(i)
        freed = prefilled = False
        for ev in events:
            if isinstance(ev, Finished):
                freed = True
                self._finished(i, ev)
            elif isinstance(ev, KVEvents) and self.policy.on_kv is not None:
                self.policy.on_kv(self.fleet.name(i), ev.events)
            elif isinstance(ev, FirstToken):
                prefilled = True  # calls held for the replica's prefill (the prefill gate) may go
        if freed:
            self._release_queued(t)
        elif prefilled and self.policy.gate_fn is not None:  # (first tokens come only with a gate)
            for req, d in self.policy.gate_fn(self.fleet.for_policy(), t):
                call = self._calls_by_id.get(req.call_id or "")
                if call is not None:
                    self._apply(call, d, t)

    def _finished(self, i: int, ev: Finished) -> None:
        call: SimCall = ev.tag
        cost = ev.gpu_seconds * self.fleet.prices[i] / 3600.0
        ok = ev.error is None
        self._record(call, ev.time, Outcome.SUCCESS if ok else Outcome.ERROR, None if ok else "replica_error",
                     replica=i, ev=ev, cost=cost)
        if self.policy.observe is not None and call.request is not None:
            view = self.fleet.views[i]
            sent = call.dispatched_s or ev.arrival
            outcome = CallOutcome(
                replica=view.name, ok=ok, gpu=view.gpu, prompt_tokens=ev.prompt_tokens,
                cached_tokens=ev.cached_tokens, completion_tokens=ev.output_tokens,
                queue_s=(call.dispatched_s or call.offered_s) - call.offered_s,
                ttft_s=None if ev.first_token is None else ev.first_token - sent, total_s=ev.time - sent,
                batch_size=self.fleet.engines[i].num_running + 1)
            self.policy.observe(call.request, outcome, ev.time)
        if ok:
            self.lifecycle.call_succeeded(call, ev.time)
            task = call.task
            if task.status is TaskStatus.SUCCEEDED and not task.spec.open_loop and self.policy.task_ended is not None:
                self.policy.task_ended(task.spec.session_id or task.spec.task_id, task.done_calls)
            if self.lifetimes is not None:
                self.lifetimes.call_ended(call, i, ev.time)
        else:
            self.lifecycle.retry_or_fail(call, ev.time, 0.0, "replica_error", avoid=self.fleet.name(i))

    def _record(self, call: SimCall, t: float, outcome: Outcome, error: str | None, *, replica: int = -1,
                ev: Finished | None = None, cost: float = 0.0) -> None:
        """Record the call's current attempt, ended at ``t``, and charge its task."""
        view = self.fleet.views[replica] if replica >= 0 else None
        if call.prefill_replica >= 0 and ev is not None:  # the decode leg's record carries the prefill's cost
            cost += call.prefill_cost
            call.prefill_cost = 0.0
        self.records.append(call_record(
            call, t, outcome=outcome, error=error, replica=view.name if view else None,
            gpu=view.gpu if view else None, ev=ev, cost=cost,
            prefill_replica=self.fleet.name(call.prefill_replica) if call.prefill_replica >= 0 else None))
        self._calls_by_id.pop(call.key, None)
        call.task.attempts += 1
        call.task.cost += cost

    # ---------------------------------------------------------------- queueing
    def _hold(self, call: SimCall) -> None:
        """Queue the call here (the policy has no queue of its own)."""
        spec = call.task.spec
        deadline = call.task.deadline_abs if call.task.deadline_abs is not None else math.inf
        self._queue_seq += 1
        heapq.heappush(self._own_queue, (Priority.rank_of(spec.priority), deadline, self._queue_seq, call))

    def _ensure_tick(self, t: float) -> None:
        if not self._tick_pending:
            self._tick_pending = True
            self.events.push(t + self.requeue_interval_s, Event.TICK, None)

    def _release_queued(self, t: float) -> None:
        """Capacity may have freed: offer the queued calls again (the policy's or ours)."""
        policy = self.policy
        if policy.release_fn is not None:
            if not policy.pending:
                # nothing to hand out: the views are set as a release would have seen them
                # (a later decision sees this state unless the replica changes again)
                self.fleet.snapshot()
                return
            for req, d in policy.release(self.fleet.for_policy(), t):
                call = self._calls_by_id.get(req.call_id or "")
                if call is not None and d.action != Action.QUEUE:
                    self._apply(call, d, t)
            if policy.queued:
                self._ensure_tick(t)
            return
        q = self._own_queue
        while q:
            _, deadline, _, call = heapq.heappop(q)
            if call.task.status is not None:
                continue
            if t > deadline:
                self._record(call, t, Outcome.TIMEOUT, "deadline_exceeded")
                fail_call(call, t, "deadline_exceeded")
                continue
            call.request = call_request(call, t, self.bs, self.cluster.hints)
            d = policy.decide(call.request, self.fleet.for_policy(), t)
            if d.action == Action.QUEUE:
                self._hold(call)
                break
            self._apply(call, d, t)
        if q:
            self._ensure_tick(t)

    # ---------------------------------------------------------------- outages
    def _outage(self, i: int, up: bool, t: float) -> None:
        eng = self.fleet.engines[i]
        if up:
            self.fleet.healthy[i] = True
            eng.model_loaded = False  # a restarted replica loads its weights again
        else:
            self.fleet.healthy[i] = False
            eng.reset(t)  # every call on it is aborted (and retried elsewhere)
            if self.policy.replica_failed is not None:
                self.policy.replica_failed(self.fleet.name(i))
        self.fleet.mark(i)
        self._engine_events(i, eng.advance(t), t)
        self._schedule_wake(i)
        if up:
            self._release_queued(t)


def simulate(cluster: ClusterSpec, workload: Workload, policy: Policy, **kw: Any) -> ClusterResult:
    """Run ``workload`` on ``cluster`` under ``policy`` in virtual time (see :class:`ClusterSim`)."""
    return ClusterSim(cluster, workload, policy, **kw).run()
