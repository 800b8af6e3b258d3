"""The placement policy as the cluster simulator calls it.

A policy is either a plain callable ``place(request, replicas) -> Decision``
(:data:`PlaceFn`) or an object with a ``decide`` method (:class:`PlacementPolicy`, such as
:class:`taskplane.scheduler.flowcontrol.controller.FlowControl`; it gets the fleet as a
:class:`~taskplane.scheduler.table.ReplicaTable`). The simulator uses the optional
capabilities below when the object has them:

- :class:`Releases`: it queues calls itself and hands them out with ``release`` (without
  it, the simulator keeps QUEUE'd calls, in priority then deadline order, and offers them
  again whenever capacity frees); ``pending`` False means nothing to hand out (the
  simulator skips the call), ``queued`` how many calls it holds;
- :class:`GatesPrefill`: a prefill gate, handed the engines' first tokens;
- :class:`ObservesCompletions`: told every placed call's outcome;
- :class:`TakesKVEvents`: the replicas' KV events, at the virtual time they happen (the
  engines only produce events for such a policy);
- :class:`WatchesOutages`: told when a replica's outage begins;
- :class:`EndsTasks`: an SDK task's end, as its worker reports it (on the policy or on its
  ``pipeline``).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from taskplane.scheduler.types import Action, CallOutcome, CallRequest, Decision, ReplicaView

Released = list[tuple[CallRequest, Decision]]
PlaceFn = Callable[[CallRequest, list[ReplicaView]], Decision]


@runtime_checkable
class PlacementPolicy(Protocol):
    def decide(self, request: CallRequest, replicas: Any, now_s: float) -> Decision: ...


@runtime_checkable
class Releases(Protocol):
    @property
    def pending(self) -> bool: ...

    @property
    def queued(self) -> int: ...

    def release(self, replicas: Any, now_s: float) -> Released: ...


@runtime_checkable
class GatesPrefill(Protocol):
    def gates_prefill(self, replicas: int) -> bool: ...

    def release_gate(self, replicas: Any, now_s: float) -> Released: ...


@runtime_checkable
class ObservesCompletions(Protocol):
    def observe_completion(self, request: CallRequest, outcome: CallOutcome, now_s: float) -> None: ...


@runtime_checkable
class TakesKVEvents(Protocol):
    def on_kv_events(self, replica: str, events: list[Any]) -> object: ...


@runtime_checkable
class WatchesOutages(Protocol):
    def replica_failed(self, replica: str) -> object: ...


@runtime_checkable
class EndsTasks(Protocol):
    def task_ended(self, session: str, calls: int | None = None) -> None: ...


Policy = PlacementPolicy | PlaceFn


class PolicyHooks:
    """A policy's capabilities, looked up once; every decide / release is timed (wall ns,
    kept apart from the deterministic records)."""

    def __init__(self, policy: Policy) -> None:
        if isinstance(policy, PlacementPolicy):
            self._decide: Callable[[CallRequest, Any, float], Decision] = policy.decide
        elif callable(policy):
            place = policy
            self._decide = lambda req, views, now: place(req, views)
        else:
            raise TypeError("policy must be callable or have a decide(request, replicas, now_s) method")
        self.wants_table = isinstance(policy, PlacementPolicy)
        self._releaser = policy if isinstance(policy, Releases) else None
        self.release_fn: Callable[[Any, float], Released] | None = (
            self._releaser.release if self._releaser is not None else None)
        # a prefill gate (flowcontrol/gate.py) is handed the engines' first tokens; only then are
        # they emitted (every extra engine event moves when the engines are stepped, and so
        # the views a policy decides on: without a gate, runs stay as they were)
        self._gate = policy if isinstance(policy, GatesPrefill) else None
        self.gate_fn: Callable[[Any, float], Released] | None = (
            self._gate.release_gate if self._gate is not None else None)
        self.observe: Callable[[CallRequest, CallOutcome, float], None] | None = (
            policy.observe_completion if isinstance(policy, ObservesCompletions) else None)
        self.on_kv: Callable[[str, list[Any]], object] | None = (
            policy.on_kv_events if isinstance(policy, TakesKVEvents) else None)
        self.replica_failed: Callable[[str], object] | None = (
            policy.replica_failed if isinstance(policy, WatchesOutages) else None)
        # flow control wraps the pipeline that learns from a task's end
        ender = policy if isinstance(policy, EndsTasks) else getattr(policy, "pipeline", None)
        self.task_ended: Callable[[str, int | None], None] | None = (
            ender.task_ended if isinstance(ender, EndsTasks) else None)
        self.decision_ns = array("q")

    def decide(self, request: CallRequest, replicas: Any, now: float) -> Decision:
        t0 = time.perf_counter_ns()
        decision = self._decide(request, replicas, now)
        self.decision_ns.append(time.perf_counter_ns() - t0)
        return decision

    def release(self, replicas: Any, now: float) -> Released:
        """The calls the policy hands out now (only with ``release_fn``)."""
        assert self.release_fn is not None
        t0 = time.perf_counter_ns()
        released = self.release_fn(replicas, now)
        if released:
            self.decision_ns.append(time.perf_counter_ns() - t0)
        return released

    def gates(self, replicas: int) -> bool:
        """Does the policy's prefill gate engage on a fleet of ``replicas`` (first tokens wanted)?"""
        return self._gate is not None and bool(self._gate.gates_prefill(replicas))

    @property
    def pending(self) -> bool:
        """False when the policy says it has nothing to release."""
        return bool(self._releaser.pending) if self._releaser is not None else True

    @property
    def queued(self) -> int:
        return int(self._releaser.queued) if self._releaser is not None else 0


def round_robin() -> Callable[[CallRequest, list[ReplicaView]], Decision]:
    """The simplest placement: healthy replicas of the model in turn (tests, examples)."""
    state = {"i": 0}

    def place(req: CallRequest, replicas: list[ReplicaView]) -> Decision:
        cands = [r for r in replicas if r.healthy and r.model == req.model and r.name not in req.avoid_replicas]
        if not cands:
            return Decision(Action.NO_REPLICA, reason="no healthy replica")
        r = cands[state["i"] % len(cands)]
        state["i"] += 1
        return Decision(Action.PLACE, replica=r.name, model=r.model)

    return place
