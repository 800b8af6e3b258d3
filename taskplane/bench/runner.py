"""Run one placement policy on one workload in the cluster simulator.

The policy is wrapped so that the decision time is measured tightly around the policy
call itself (``decide`` — and ``release`` for calls an admission queue hands out, per
call released) and so that a progress callback learns how many calls have finished.
Everything else the simulator needs (KV events, completions, failures, the queue depth)
passes straight through.
"""

from __future__ import annotations

import gc
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taskplane.scheduler.kv.lifetimes import LifetimePlanner
from taskplane.scheduler.types import CallOutcome, CallRequest, Decision, ReplicaView
from taskplane.sim.cluster import ClusterResult, ClusterSpec, simulate
from taskplane.sim.workloads.base import Workload

Progress = Callable[[int], None]  # calls finished so far
_clock, _cpu = time.perf_counter_ns, time.thread_time_ns  # read around every decision


class TimedPolicy:
    """A Scheduler-like object (or a plain ``place(request, replicas)`` callable) with
    its decisions timed and its completions counted."""

    def __init__(self, policy: Any, progress: Progress | None = None, every: int = 200) -> None:
        self.inner = policy
        self.decision_ns = array("q")  # wall clock around each policy call
        self.decision_cpu_ns = array("q")  # the deciding thread's CPU time (no preemption)
        self.done = 0
        self._progress = progress
        self._every = max(1, every)
        self._observe: Callable[[CallRequest, CallOutcome, float], None] | None = getattr(
            policy, "observe_completion", None)
        decide = getattr(policy, "decide", None)
        if decide is None:
            if not callable(policy):
                raise TypeError("policy must be callable or have a decide(request, replicas, now_s) method")
            self._decide: Callable[[CallRequest, Any, float], Decision] = lambda r, v, now: policy(r, v)
        else:
            self._decide = decide

    # the simulator probes for these with getattr: forward only what the policy has
    def __getattr__(self, name: str) -> Any:
        if name in ("release", "release_gate", "on_kv_events", "replica_failed"):
            return getattr(self.inner, name)
        raise AttributeError(name)

    @property
    def queued(self) -> int:
        return int(getattr(self.inner, "queued", 0))

    def gates_prefill(self, replicas: int) -> bool:
        """Whether the policy's prefill gate is on (the simulator then hands it first tokens)."""
        gates = getattr(self.inner, "gates_prefill", None)
        return bool(gates(replicas)) if gates is not None else False

    @property
    def pending(self) -> bool:
        """Whether ``release`` may hand anything out (the simulator skips it when not)."""
        return bool(getattr(self.inner, "pending", True))

    def decide(self, request: CallRequest, replicas: Any, now_s: float) -> Decision:
        clock, cpu = _clock, _cpu
        c0 = cpu()
        t0 = clock()
        d = self._decide(request, replicas, now_s)
        t1 = clock()
        self.decision_cpu_ns.append(cpu() - c0)
        self.decision_ns.append(t1 - t0)
        return d

    def observe_completion(self, request: CallRequest, outcome: CallOutcome, now_s: float) -> None:
        if self._observe is not None:
            self._observe(request, outcome, now_s)
        self.done = done = self.done + 1
        if self._progress is not None and done % self._every == 0:
            self._progress(done)


class TimedScheduler(TimedPolicy):
    """:class:`TimedPolicy` for objects with ``release``: times each released call too."""

    def release(self, replicas: list[ReplicaView], now_s: float) -> list[tuple[CallRequest, Decision]]:
        if not getattr(self.inner, "pending", True):  # nothing to hand out: no decision to time
            return self.inner.release(replicas, now_s)  # type: ignore[no-any-return]
        clock, cpu = time.perf_counter_ns, time.thread_time_ns
        c0 = cpu()
        t0 = clock()
        out = self.inner.release(replicas, now_s)
        dt = clock() - t0
        dc = cpu() - c0
        if out:
            per, per_cpu = dt // len(out), dc // len(out)
            for _ in out:
                self.decision_ns.append(per)
                self.decision_cpu_ns.append(per_cpu)
        return out  # type: ignore[no-any-return]


def wrap(policy: Any, progress: Progress | None = None) -> TimedPolicy:
    return (TimedScheduler if hasattr(policy, "release") else TimedPolicy)(policy, progress)


@dataclass(slots=True)
class Run:
    result: ClusterResult
    decision_ns: array
    wall_s: float
    decision_cpu_ns: array | None = None
    cpu_s: float | None = None


def run_policy(
    policy: Any,
    workload: Workload,
    cluster: ClusterSpec,
    *,
    seed: int = 0,
    progress: Progress | None = None,
    kv_lifetimes: LifetimePlanner | None = None,
    simulator: Callable[..., ClusterResult] = simulate,
) -> Run:
    """Simulate ``workload`` on ``cluster`` placed by ``policy``; returns records and timings
    (``simulator``: another loop with ``simulate``'s signature, e.g. several models per replica)."""
    timed = wrap(policy, progress)
    # the simulator allocates millions of short-lived objects; a cyclic-GC pass landing
    # inside a timed decision would be charged to the policy, so the collector is paused
    # for the run (the records hold no reference cycles worth collecting early)
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    c0 = time.process_time()
    t0 = time.perf_counter()
    try:
        result = simulator(cluster, workload, timed, seed=seed, kv_lifetimes=kv_lifetimes)
    finally:
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        if was_enabled:
            gc.enable()
    return Run(result=result, decision_ns=timed.decision_ns, wall_s=wall,
               decision_cpu_ns=timed.decision_cpu_ns, cpu_s=cpu)
