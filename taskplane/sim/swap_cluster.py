"""The cluster simulator with several base models per replica: a call of an asleep model swaps it in.

A replica whose :class:`~taskplane.sim.fleet.ReplicaSpec` hosts several models runs one
engine per model on its GPU, as two vLLM engines with ``--enable-sleep-mode`` would: one
awake, the others asleep at the spec's ``sleep_level`` (level 1: weights in host memory).
A call placed there for an asleep model starts a swap, with :mod:`taskplane.sim.sleep`'s
timings:

1. drain: the awake engine takes nothing new and its calls in flight finish, running and
   queued alike (vLLM's ``POST /sleep?mode=wait``); calls arriving meanwhile, of either
   model, are held at the replica and count as its waiting calls;
2. sleep: the awake engine sleeps (level 1 copies its weights to the host), its KV cache
   is discarded and the replica publishes ``AllBlocksCleared``;
3. wake: the call's engine wakes (``POST /wake_up``) with an empty KV cache, and the held
   calls of that model are submitted; held calls of another model start the next swap.

During the swap the replica serves neither model. Its view says what a live control plane
knows: ``model`` is the model being woken, ``models_asleep`` the others (the engines'
``vllm:engine_sleep_state``), and ``swap_ready_s`` when the swap should be done by the
fleet's usual swap time (:class:`~taskplane.scheduler.swapcost.SwapCosts`' priors). Each
call that waited for a swap reports the wait as its ``cold_start_s``, so the latency
model's calibration is not skewed by it. Not modelled: KV tiers on a multi-model replica's
asleep engines, and an outage in the middle of a swap (the swap completes on schedule).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from taskplane.scheduler.swapcost import SwapCosts
from taskplane.scheduler.types import CallOutcome, CallRequest, Decision
from taskplane.sim.calls import SimCall
from taskplane.sim.cluster import ClusterSim, ClusterSpec, Policy
from taskplane.sim.engine import SimEngine
from taskplane.sim.events import Event
from taskplane.sim.results import ClusterResult
from taskplane.sim.sleep import sleep_seconds, wake_seconds
from taskplane.sim.workloads.base import Workload

DRAIN, WAKE = "drain", "wake"


@dataclass(slots=True)
class Hosting:
    """One multi-model replica: its engines by model, the awake one, a swap under way."""

    engines: dict[str, SimEngine]
    awake: str
    level: int
    target: str | None = None  # the model the swap under way wakes
    phase: str = ""  # DRAIN or WAKE while a swap is under way
    started_s: float = 0.0
    held: list[tuple[SimCall, Decision]] = field(default_factory=list)
    waited: dict[str, float] = field(default_factory=dict)  # call key -> seconds held for a swap
    swaps: int = 0
    swap_s: float = 0.0  # total seconds the replica served neither model

    def asleep(self) -> frozenset[str]:
        serving = self.target or self.awake
        return frozenset(m for m in self.engines if m != serving)


class SwapSim(ClusterSim):
    """A cluster run whose replicas may host several base models (see the module docstring)."""

    def __init__(self, cluster: ClusterSpec, workload: Workload, policy: Policy, **kw: Any) -> None:
        super().__init__(cluster, workload, policy, **kw)
        self.hosting: dict[int, Hosting] = {}
        self.swap_prior = SwapCosts()
        for i, r in enumerate(cluster.replicas):
            if len(r.hosted()) < 2:
                continue
            eng = self.fleet.engines[i]
            engines = {r.model: eng}
            for m in r.hosted()[1:]:
                other = SimEngine(dataclasses.replace(eng.config, model=m, model_loaded=True))
                other.stats = other.batcher.stats = eng.stats  # the replica's counters, whichever engine runs
                engines[m] = other
            self.hosting[i] = Hosting(engines, r.model, r.sleep_level)
        observe = self.policy.observe
        if observe is not None and self.hosting:
            self.policy.observe = self._observer(observe)

    def _observer(self, observe: Any) -> Any:
        """The policy's completion hook, told the swap wait each call paid (as a weight load)."""
        def observed(request: CallRequest, outcome: CallOutcome, now_s: float) -> None:
            i = self.fleet.find(outcome.replica)
            h = self.hosting.get(i) if i is not None else None
            waited = h.waited.pop(request.call_id or "", None) if h is not None else None
            if waited:
                outcome.cold_start_s = waited
            observe(request, outcome, now_s)
        return observed

    def run(self) -> ClusterResult:
        result = super().run()
        for i, h in self.hosting.items():
            result.replicas[i].model_swaps, result.replicas[i].swap_s = h.swaps, round(h.swap_s, 3)
        return result

    # ---------------------------------------------------------------- the swap
    def _submit(self, call: SimCall, d: Decision, i: int, t: float) -> None:
        h = self.hosting.get(i)
        model = call.task.spec.model
        if h is None or (h.target is None and model == h.awake):
            super()._submit(call, d, i, t)
            return
        h.held.append((call, d))
        self._held_changed(i, h)
        if h.target is None:
            self._begin(i, h, model, t)

    def _begin(self, i: int, h: Hosting, model: str, t: float) -> None:
        """Start a swap to ``model``: the awake engine drains first."""
        h.target, h.phase, h.started_s = model, DRAIN, t
        self._set_view(i, h, ready_s=t + self.swap_prior.seconds(h.level))
        self._try_sleep(i, h, t)

    def _try_sleep(self, i: int, h: Hosting, t: float) -> None:
        """Once the awake engine has drained: it sleeps (KV discarded), the target wakes."""
        eng = self.fleet.engines[i]
        if h.phase != DRAIN or eng.num_running or eng.num_waiting or h.target is None:
            return
        h.phase = WAKE
        gpu = eng.config.gpu
        took = sleep_seconds(gpu, h.awake, h.level) + wake_seconds(gpu, h.target, h.level)
        eng.reset(t, "aborted: engine asleep")  # idle: nothing aborted; AllBlocksCleared
        self._set_view(i, h, ready_s=t + self.swap_prior.seconds(h.level))
        self._engine_events(i, eng.advance(t), t)
        self.events.push(t + took, Event.CONTROL, i)

    def _control(self, payload: Any, t: float) -> None:
        """Replica ``payload``'s swap is done: the woken engine takes the held calls of its model."""
        i: int = payload
        h = self.hosting[i]
        assert h.target is not None
        engine = h.engines[h.target]
        engine.batcher.t = max(engine.batcher.t, t)
        self.fleet.engines[i] = engine
        h.swaps += 1
        h.swap_s += t - h.started_s
        h.awake, h.target, h.phase = h.target, None, ""
        self._set_view(i, h, ready_s=0.0)
        held, h.held = h.held, []
        for call, d in held:
            if call.task.spec.model != h.awake:
                h.held.append((call, d))
            elif call.task.status is None:
                h.waited[call.key] = t - (call.dispatched_s or t)
                super()._submit(call, d, i, t)
        self._held_changed(i, h)
        if h.held:
            self._begin(i, h, h.held[0][0].task.spec.model, t)
        self.fleet.mark(i)
        self._schedule_wake(i)
        self._release_queued(t)

    def _engine_events(self, i: int, events: list[Any], t: float) -> None:
        super()._engine_events(i, events, t)
        h = self.hosting.get(i) if self.hosting else None
        if h is not None and h.phase == DRAIN:
            self._try_sleep(i, h, t)

    # ---------------------------------------------------------------- what the policy sees
    def _set_view(self, i: int, h: Hosting, *, ready_s: float) -> None:
        """A new view object (the table notices the model change): serving, asleep, when ready."""
        fleet = self.fleet
        fleet.views[i] = dataclasses.replace(fleet.views[i], model=h.target or h.awake, models_asleep=h.asleep(),
                                             model_loaded=True, swap_ready_s=ready_s)
        fleet.mark(i)

    def _held_changed(self, i: int, h: Hosting) -> None:
        if h.held:
            self.fleet.held[i] = (len(h.held), sum(c.prompt_tokens for c, _ in h.held))
        else:
            self.fleet.held.pop(i, None)
        self.fleet.mark(i)


def simulate_models(cluster: ClusterSpec, workload: Workload, policy: Policy, **kw: Any) -> ClusterResult:
    """Run ``workload`` on a fleet whose replicas may host several base models (:class:`SwapSim`)."""
    return SwapSim(cluster, workload, policy, **kw).run()
