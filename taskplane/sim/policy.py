"""The placement policy as the cluster simulator calls it.

A policy is either a plain callable ``place(request, replicas) -> Decision`` or an object
with the :class:`taskplane.scheduler.flowcontrol.controller.FlowControl` interface, whose optional parts are
used when present:

- ``decide(request, replicas, now_s)`` instead of calling the object (such a policy gets
  the fleet as a :class:`~taskplane.scheduler.table.ReplicaTable`);
- ``release(replicas, now_s) -> [(request, decision)]`` to hand out calls it queued
  (without it, the simulator keeps QUEUE'd calls itself, in priority then deadline order,
  and offers them again whenever capacity frees);
- ``pending``: False when ``release`` has nothing to hand out (nothing queued): the
  simulator then skips the call; ``queued``: how many calls it holds;
- ``observe_completion(request, outcome, now_s)`` after every placed call;
- ``on_kv_events(replica, events)``: the replicas' KV events, at the virtual time they
  happen (the engines only produce events when this exists);
- ``replica_failed(replica)`` when an outage begins.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from typing import Any

from taskplane.scheduler.types import Action, CallOutcome, CallRequest, Decision, ReplicaView

Policy = Any  # a callable place(request, replicas) -> Decision, or a FlowControl-like object


class PolicyHooks:
    """A policy's parts, looked up once; every decide / release is timed (wall ns, kept
    apart from the deterministic records)."""

    def __init__(self, policy: Policy) -> None:
        if hasattr(policy, "decide"):
            self._decide: Callable[[CallRequest, Any, float], Decision] = policy.decide
        elif callable(policy):
            self._decide = lambda req, views, now: policy(req, views)
        else:
            raise TypeError("policy must be callable or have a decide(request, replicas, now_s) method")
        self.policy = policy
        self.wants_table = hasattr(policy, "decide")
        self.release_fn: Callable[[Any, float], list[tuple[CallRequest, Decision]]] | None = getattr(
            policy, "release", None)
        # a prefill gate (flowcontrol/gate.py) is handed the engines' first tokens; only then are
        # they emitted (every extra engine event moves when the engines are stepped, and so
        # the views a policy decides on: without a gate, runs stay as they were)
        self.gate_fn: Callable[[Any, float], list[tuple[CallRequest, Decision]]] | None = getattr(
            policy, "release_gate", None)
        self._gates: Callable[[int], bool] | None = getattr(policy, "gates_prefill", None)
        self.observe: Callable[[CallRequest, CallOutcome, float], None] | None = getattr(
            policy, "observe_completion", None)
        self.on_kv: Callable[[str, list[Any]], None] | None = getattr(policy, "on_kv_events", None)
        self.replica_failed: Callable[[str], None] | None = getattr(policy, "replica_failed", None)
        # an SDK task's end, as its worker reports it (flow control wraps the pipeline that learns from it)
        self.task_ended: Callable[[str, int | None], None] | None = getattr(
            policy, "task_ended", None) or getattr(getattr(policy, "pipeline", None), "task_ended", None)
        self.decision_ns = array("q")

    def decide(self, request: CallRequest, replicas: Any, now: float) -> Decision:
        t0 = time.perf_counter_ns()
        decision = self._decide(request, replicas, now)
        self.decision_ns.append(time.perf_counter_ns() - t0)
        return decision

    def release(self, replicas: Any, now: float) -> list[tuple[CallRequest, Decision]]:
        """The calls the policy hands out now (only with ``release_fn``)."""
        assert self.release_fn is not None
        t0 = time.perf_counter_ns()
        released = self.release_fn(replicas, now)
        if released:
            self.decision_ns.append(time.perf_counter_ns() - t0)
        return released

    def gates(self, replicas: int) -> bool:
        """Does the policy's prefill gate engage on a fleet of ``replicas`` (first tokens wanted)?"""
        return self.gate_fn is not None and self._gates is not None and bool(self._gates(replicas))

    @property
    def pending(self) -> bool:
        """False when the policy says it has nothing to release."""
        return bool(getattr(self.policy, "pending", True))

    @property
    def queued(self) -> int:
        return int(getattr(self.policy, "queued", 0))


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
