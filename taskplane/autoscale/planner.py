"""taskplane's autoscaler: fleet size from the work the workflows in flight still have to do.

What only the control plane sees, and what it does with it:

- workflows in flight, each with its steps remaining and its agent's learned cost per step
  (work units: decode-token equivalents, from task history) and pace (seconds per step): the GPU work the pool will
  have to do over the next cold start is known before it reaches any queue;
- new workflows' arrival rate, so demand that will arrive while a replica loads is covered;
- deadline slack: workflows that cannot afford queueing count extra;
- pinned working sets: on scale-in the replica whose pinned sessions are predicted to end
  soonest is the victim. As soon as demand falls below the scale-in line it is *pre-drained*
  (still serving, counted as capacity, but no new session is pinned there), then after the
  delay *cordoned* (no new sessions, its sessions finish their steps) and drained once they
  are done, or once waiting for them costs more GPU-seconds than re-prefilling their
  context elsewhere (``cordon_max_s`` caps the wait); calls in flight always finish;
- cold start and price per GPU generation: capacity is added early enough to be ready when
  needed, on the cheapest generation (price per unit of work) that meets the pool's SLO;
- an idle pool goes to zero; a held call wakes it;
- vLLM sleep mode: a sleeping replica (still paid for, its GPU held) is the first capacity
  added, ready after its wake instead of a cold start; the look-ahead stays the cold start's
  (waking a sleeper early costs nothing more, and the capacity beyond the sleepers still
  needs the cold start's lead); one left asleep ``sleep_max_s`` is deleted, since it costs
  as much as a serving one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from taskplane.autoscale.types import (
    AgentProfile,
    Generation,
    Phase,
    Plan,
    PoolSignals,
    ReplicaState,
    WorkflowSignal,
)
from taskplane.autoscale.victims import drain_seconds, reprefill_gpu_seconds, soonest_drained


@dataclass(slots=True)
class PlannerConfig:
    # planned share of the profiled capacity for the demand of now (profiled at >= 95 % met:
    # batching has room above it), and for the demand forecast a cold start ahead: that one
    # already counts every workflow expected, so it needs less headroom (None: target_load)
    target_load: float = 1.1
    forecast_load: float | None = 1.3
    interval_s: float = 10.0  # how often the plan is recomputed
    scale_in_delay_s: float = 60.0  # demand must stay below capacity this long before scale-in
    hysteresis: float = 0.85  # scale in only when demand < (replicas - 1) x this
    urgent_slack: float = 1.2  # a workflow whose budget < its expected time x this counts 1.5x
    cordon_max_s: float = 300.0  # then a cordoned replica's remaining sessions are moved
    # a cordoned replica is drained once its sessions' predicted time left (GPU-seconds held
    # idle) exceeds the GPU-seconds re-prefilling their context elsewhere costs
    price_cordon: bool = True
    # the next scale-in victim takes no new session from the moment demand falls below the line
    predrain: bool = True
    idle_to_zero_s: float = 120.0  # no workflow, arrival or held call this long: the pool may go to 0
    sleep_max_s: float = 600.0  # a replica asleep this long is deleted (it holds its GPU: paid idle time)
    # live stacks: calls in flight + queued per replica above which capacity is short
    # whatever the workflows say (requests from plain OpenAI clients carry no workflow); None: off
    concurrency_per_replica: float | None = None
    reference_work_per_step: float = 300.0  # prior until history teaches a profile
    reference_seconds_per_step: float = 5.0
    reference_steps_per_task: float = 5.0


class TaskplaneAutoscaler:
    name = "taskplane"

    def __init__(self, config: PlannerConfig | None = None) -> None:
        self.cfg = config or PlannerConfig()
        self._last = -math.inf
        self._below_since: float | None = None
        self._busy_since = 0.0
        self._predrained: str | None = None
        self.last_demand = 0.0  # GPU-seconds per second (reference GPU), for metrics

    # ---------------------------------------------------------------- demand
    def _profile(self, s: PoolSignals, w: WorkflowSignal) -> AgentProfile:
        p = s.profiles.get(w.agent) or s.default_profile
        return p or AgentProfile(self.cfg.reference_work_per_step, self.cfg.reference_seconds_per_step)

    def demand(self, s: PoolSignals, horizon_s: float) -> float:
        """Work units per second needed now or ``horizon_s`` from now, the larger."""
        return max(self.demand_now_and_ahead(s, horizon_s))

    def demand_now_and_ahead(self, s: PoolSignals, horizon_s: float) -> tuple[float, float]:
        """Work units per second needed now (live workflows' rates) and ``horizon_s`` from
        now (those still alive at the horizon, plus the workflows expected to arrive by then)."""
        now_rate = at_h = 0.0
        for w in s.workflows:
            if w.steps_remaining <= 0:
                continue
            p = self._profile(s, w)
            rate = p.work_per_step / max(p.seconds_per_step, 1e-3)
            expected_s = w.steps_remaining * p.seconds_per_step
            if w.budget_s is not None and w.budget_s < expected_s * self.cfg.urgent_slack:
                rate *= 1.5
            now_rate += rate
            at_h += rate * min(1.0, expected_s / max(horizon_s, 1e-3))
        prior = s.default_profile or AgentProfile(self.cfg.reference_work_per_step,
                                                  self.cfg.reference_seconds_per_step)
        # of the workflows arriving within the horizon, those still running at its end: all of
        # them when a task outlasts the horizon, else only the last task-length's worth (a
        # slow cold start must not plan for every arrival of its two minutes at once)
        task_s = (prior.steps_per_task or self.cfg.reference_steps_per_task) * prior.seconds_per_step
        arriving = s.arrivals_per_s * min(horizon_s, task_s)
        at_h += arriving * prior.work_per_step / max(prior.seconds_per_step, 1e-3)
        return now_rate, at_h

    # ---------------------------------------------------------------- plan
    def plan(self, s: PoolSignals) -> Plan:
        cfg = self.cfg
        active = s.active()
        plan = Plan(pool=s.pool, desired=len(active), grace_s=None)
        drain_s = drain_seconds(s.workflows, lambda w: self._profile(s, w))
        plan.drain = self._cordoned_done(s, drain_s) + self._sleepers_expired(s)
        if s.now_s - self._last < cfg.interval_s and not (s.held_requests and not active):
            return plan
        self._last = s.now_s
        gens = [g for g in s.generations if g.meets_slo] or s.generations
        horizon = max(g.cold_start_s for g in gens) + cfg.interval_s
        now_rate, ahead = self.demand_now_and_ahead(s, horizon)
        need = max(now_rate / cfg.target_load, ahead / (cfg.forecast_load or cfg.target_load))
        if cfg.concurrency_per_replica and s.generations:
            load = sum(r.inflight for r in active) + s.queued_requests
            need = max(need, load / cfg.concurrency_per_replica * s.generations[0].capacity_per_s)
        self.last_demand = need
        if s.workflows or s.arrivals_per_s > 0 or s.held_requests or s.queued_requests or any(
                r.inflight for r in active):
            self._busy_since = s.now_s
        capacity = sum(self._speed(s, r.gpu) for r in active)
        idle = s.now_s - self._busy_since >= cfg.idle_to_zero_s
        floor = s.min_replicas if idle else max(s.min_replicas, 1)
        if s.held_requests and not active:
            floor = max(floor, 1)
        if need > capacity or len(active) < floor:
            self._below_since = None
            self._grow(s, plan, need - capacity, floor - len(active), gens)
        elif len(active) > floor:
            self._shrink(s, plan, need, capacity, floor, idle, drain_s)
        if self._below_since is None or plan.cordon:
            self._predrained = None
        plan.predrain = [self._predrained] if self._predrained is not None and cfg.predrain else []
        plan.desired = len(active) + len(plan.start) + len(plan.uncordon) + len(plan.wake) - len(plan.cordon)
        return plan

    def _sleepers_expired(self, s: PoolSignals) -> list[str]:
        return [r.name for r in s.sleeping() if s.now_s - r.phase_since_s >= self.cfg.sleep_max_s]

    def _speed(self, s: PoolSignals, gpu: str) -> float:
        """One replica's capacity (work units per second within the SLO)."""
        for g in s.generations:
            if g.gpu == gpu:
                return g.capacity_per_s
        return s.generations[0].capacity_per_s if s.generations else 1.0

    def _grow(self, s: PoolSignals, plan: Plan, missing: float, min_new: int, gens: list[Generation]) -> None:
        """Uncordon first (warm, already paid for), then start the cheapest work per dollar."""
        cordoned = sorted((r for r in s.replicas if r.phase is Phase.CORDONED), key=lambda r: -r.live_session_tokens)
        room = s.max_replicas - len(s.replicas)  # cordoned and draining ones still hold a slot
        for r in cordoned:
            if (missing <= 0 and min_new <= 0) or room <= 0:
                break
            plan.uncordon.append(r.name)
            missing -= self._speed(s, r.gpu)
            min_new -= 1
            room -= 1
        # a sleeping replica is already paid for and wakes in seconds: before any cold start
        wake_s = {g.gpu: g.wake_s or g.cold_start_s for g in s.generations}
        for r in sorted(s.sleeping(), key=lambda r: (wake_s.get(r.gpu, 0.0), r.name)):
            if missing <= 0 and min_new <= 0:
                break
            if r.name in plan.drain:
                continue
            plan.wake.append(r.name)
            missing -= self._speed(s, r.gpu)
            min_new -= 1
        counts = {g.gpu: sum(1 for r in s.replicas if r.gpu == g.gpu) for g in gens}
        by_price = sorted(gens, key=lambda g: (g.cost_per_hour_usd / max(g.capacity_per_s, 1e-9), g.cold_start_s))
        while (missing > 1e-9 or min_new > 0) and room > 0:
            g = next((g for g in by_price if counts[g.gpu] < g.max_replicas), None)
            if g is None:
                break
            plan.start.append(g.gpu)
            counts[g.gpu] += 1
            missing -= g.capacity_per_s
            min_new -= 1
            room -= 1
        if plan.start or plan.uncordon or plan.wake:
            plan.reasons.append(
                f"demand {self.last_demand:.2f} work/s over capacity: start {','.join(plan.start) or '-'}"
                f" uncordon {','.join(plan.uncordon) or '-'} wake {','.join(plan.wake) or '-'}")

    def _victim(self, active: list[ReplicaState], drain_s: dict[str, float]) -> ReplicaState | None:
        """The replica to give up next: the pre-drained one while it still serves (its
        sessions have been thinning out), else the one expected to drain soonest."""
        keep = next((r for r in active if r.name == self._predrained and r.phase is Phase.READY), None)
        if keep is not None:
            return keep
        name = soonest_drained(active, 1, drain_s)
        return next((r for r in active if name and r.name == name[0]), None)

    def _shrink(self, s: PoolSignals, plan: Plan, need: float, capacity: float, floor: int, idle: bool,
                drain_s: dict[str, float]) -> None:
        """Give up one replica once demand stayed low long enough: a starting one is simply
        stopped (no cache, nothing in flight); a ready one, the soonest drained, is pre-drained
        while the delay runs, then cordoned."""
        active = s.active()
        victim = self._victim(active, drain_s)
        if victim is None:
            return
        if not idle and need >= (capacity - self._speed(s, victim.gpu)) * self.cfg.hysteresis:
            self._below_since = None
            return
        if self._below_since is None:
            self._below_since = s.now_s
        if victim.phase is Phase.READY:
            self._predrained = victim.name
        if s.now_s - self._below_since < self._scale_in_delay(s, need, capacity, victim) and not idle:
            return
        self._below_since = s.now_s  # one replica per delay
        if victim.phase is Phase.STARTING:
            plan.drain.append(victim.name)
            plan.reasons.append(f"demand {need:.2f} work/s fits without {victim.name}: stop it before it serves")
            return
        if sum(1 for r in active if r.phase is Phase.READY) <= max(floor, 1) and len(active) > 1:
            return  # never cordon the last ready replica while another is still starting
        plan.cordon.append(victim.name)
        plan.reasons.append(f"demand {need:.2f} work/s fits without {victim.name}: cordon it "
                            f"({victim.live_session_tokens} live-session tokens, {victim.live_sessions} sessions)")

    def _scale_in_delay(self, s: PoolSignals, need: float, capacity: float, victim: ReplicaState) -> float:
        """How long demand must stay low before the next scale-in: ``scale_in_delay_s`` while
        fewer than four replicas are spare, ``scale_in_delay_s / (spare // 2)`` beyond (a large
        fleet after its peak would otherwise give up one replica a minute while paying for the
        rest; half the spare count keeps a margin for the deadlines of the ramp down)."""
        speed = self._speed(s, victim.gpu)
        spare = (capacity - need / self.cfg.hysteresis) / max(speed, 1e-9)
        return self.cfg.scale_in_delay_s / max(1.0, math.floor(spare / 2))

    def _cordoned_done(self, s: PoolSignals, drain_s: dict[str, float]) -> list[str]:
        """Cordoned replicas to drain now: no live session left; or waiting for its sessions
        (``drain_s``: their predicted time left, a whole GPU held for it) costs more GPU-seconds
        than re-prefilling their context elsewhere; or cordoned ``cordon_max_s``. Sessions
        still there are then moved deliberately: their next step prefills elsewhere."""
        out = []
        for r in s.replicas:
            if r.phase is not Phase.CORDONED:
                continue
            waited = s.now_s - r.phase_since_s
            priced = self.cfg.price_cordon and drain_s.get(r.name, 0.0) > reprefill_gpu_seconds(
                r.live_session_tokens, self._speed(s, r.gpu))
            if r.live_sessions == 0 or priced or waited >= self.cfg.cordon_max_s:
                out.append(r.name)
        return out

