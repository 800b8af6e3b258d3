"""Replicas that start and stop in the virtual-time cluster: the autoscaler's simulator.

:class:`FleetSim` extends :class:`~taskplane.sim.cluster.ClusterSim`: every replica the pool
may ever have is a slot of the cluster; a slot is *provisioned* (paid for) from the moment
the autoscaler starts it, serves after its generation's cold start, and stops when its
drain ends (its calls in flight done, or killed when the autoscaler's grace period is over:
those calls are aborted and retried, and counted as failed in flight), or, with
``sleep_level``, sleeps once drained (vLLM sleep mode: its slot stays provisioned and paid
for, its KV cache is dropped) until a plan wakes it (ready after the generation's
``wake_s``) or it has slept too long and stops. Placement is the
same scheduler object for every autoscaler; :class:`~taskplane.sim.fleet_policy.FleetPolicy` around it keeps cordoned
replicas for their own sessions, holds calls while the pool has no ready replica, and
remembers where each session's KV lives (the pinned working sets).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from taskplane.autoscale.fleet import FleetBook, FleetInterval
from taskplane.autoscale.registry import Autoscaler
from taskplane.autoscale.types import (
    AgentProfile,
    Generation,
    Phase,
    Plan,
    PoolSignals,
    WorkflowSignal,
    work_units,
)
from taskplane.sim.calls import SimCall, TaskState
from taskplane.sim.cluster import ClusterSim
from taskplane.sim.events import Event
from taskplane.sim.fleet import ClusterSpec, ReplicaSpec
from taskplane.sim.fleet_policy import FleetPolicy
from taskplane.sim.gpus import default_cold_start_s, gpu_profile
from taskplane.sim.hints import HintMode, steps_hint
from taskplane.sim.policy import Policy
from taskplane.sim.requests import Finished
from taskplane.sim.results import ClusterResult
from taskplane.sim.sleep import wake_seconds
from taskplane.sim.workloads.base import Workload
from taskplane.store.records import Outcome

_REF = gpu_profile("h100")


def generation(gpu: str, model: str, *, max_replicas: int, capacity_per_s: float,
               cold_start_s: float | None = None) -> Generation:
    """A GPU generation's price, cold start and speed (relative to an H100: the geometric
    mean of its bandwidth and FLOPS ratios) from the simulator's profiles; ``capacity_per_s``
    is an H100's profiled capacity (work units per second), scaled by the speed."""
    p = gpu_profile(gpu)
    speed = ((p.mem_bw_gbs * p.bw_efficiency) / (_REF.mem_bw_gbs * _REF.bw_efficiency)
             * (p.peak_tflops * p.flops_efficiency) / (_REF.peak_tflops * _REF.flops_efficiency)) ** 0.5
    return Generation(gpu=gpu, cost_per_hour_usd=p.price_per_hour_usd,
                      cold_start_s=cold_start_s if cold_start_s is not None else default_cold_start_s(gpu, model),
                      relative_speed=speed, capacity_per_s=capacity_per_s * speed, max_replicas=max_replicas,
                      meets_slo=gpu != "cpu")


@dataclass(slots=True)
class FleetStats:
    failed_inflight_calls: int = 0  # calls in flight on a replica killed at scale-in
    reprefill_tokens_after_scale_in: int = 0  # live-session context lost with drained replicas
    cold_starts: int = 0
    sleeps: int = 0  # drained replicas put to sleep instead of stopped (sleep_level)
    wakes: int = 0  # scale-outs served by waking a sleeper (a hot start)
    decisions: list[dict[str, Any]] = field(default_factory=list)  # every non-empty plan
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)  # (t, provisioned, ready, in flight)
    # per-tick sums over ready replicas (a fixed fleet's profile calibrates the baselines'
    # targets): waiting + queued, running + waiting + queued, KV usage; and tick count
    metric_sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])


@dataclass
class FleetResult:
    cluster: ClusterResult
    intervals: list[FleetInterval]
    stats: FleetStats
    horizon_s: float

    @property
    def gpu_hours(self) -> float:
        return sum(iv.hours(self.horizon_s) for iv in self.intervals)

    @property
    def fleet_cost_usd(self) -> float:
        return sum(iv.hours(self.horizon_s) * iv.cost_per_hour_usd for iv in self.intervals)


#: a task's length before any of its agent's tasks has finished (the live signals' prior too)
DEFAULT_TASK_STEPS = 5.0


@dataclass(frozen=True, kw_only=True)
class FleetOptions:
    """The autoscaled pool: the generations it may use, its bounds, the replicas ready at
    the start, how long it runs and how often the autoscaler plans."""

    generations: list[Generation]
    min_replicas: int
    max_replicas: int
    initial: int  # replicas of the first generation ready at time 0
    horizon_s: float
    tick_s: float = 1.0
    sleep_level: int = 0  # > 0: drained replicas sleep (vLLM sleep mode) instead of stopping


class FleetSim(ClusterSim):
    """One run of a workload on an autoscaled pool. ``cluster`` holds every slot."""

    def __init__(self, cluster: ClusterSpec, workload: Workload, policy: Policy, autoscaler: Autoscaler,
                 options: FleetOptions, **kw: Any) -> None:
        pool = cluster.replicas[0].model
        generations, sleep_level = options.generations, options.sleep_level
        self._slot_free = {g.gpu: [i for i, r in enumerate(cluster.replicas) if r.gpu == g.gpu] for g in generations}
        self._slot_of: dict[str, int] = {}
        if sleep_level:  # a sleeper's wake is its cold start: the planner's look-ahead while one exists
            generations = [g if g.wake_s is not None else dataclasses.replace(
                g, wake_s=wake_seconds(g.gpu, pool, sleep_level)) for g in generations]
        self.book = FleetBook(pool, generations, namer=self._name_slot, sleep_level=sleep_level)
        self.fleet_policy = FleetPolicy(policy, self.book)
        super().__init__(cluster, workload, self.fleet_policy, **kw)
        self.autoscaler, self.generations = autoscaler, generations
        self.min_replicas, self.max_replicas = options.min_replicas, options.max_replicas
        self.horizon_s, self.tick_s = options.horizon_s, options.tick_s
        self.stats = FleetStats()
        self._work_by_agent: dict[str, float] = {}
        self._calls_by_agent: dict[str, int] = {}
        self._live_cursor = 0
        for i in range(len(self.fleet.engines)):
            self.fleet.healthy[i] = False
            self.fleet.mark(i)
        for _ in range(options.initial):
            self._take_slot(generations[0].gpu, 0.0, ready=True)
        self._pending_tasks = deque(sorted(self.workload.tasks, key=lambda t: t.arrival_s))
        self._arrivals: deque[float] = deque()
        self._live: dict[str, TaskState] = {}
        self._profile_sum: dict[str, list[float]] = {}  # agent -> [calls, seconds] of finished tasks
        self._tasks_by_agent: dict[str, int] = {}  # finished tasks per agent (their mean length)
        self.events.push(0.0, Event.CONTROL, None)

    # ---------------------------------------------------------------- slots
    def _name_slot(self, gpu: str) -> str:
        free = self._slot_free[gpu]
        if not free:
            raise RuntimeError(f"no free {gpu} slot: the autoscaler passed the generation's max_replicas")
        i = free.pop(0)
        name = self.cluster.replicas[i].name
        self._slot_of[name] = i
        return name

    def _take_slot(self, gpu: str, t: float, *, ready: bool) -> str:
        name = self.book.provision(gpu, t, ready=ready)
        if ready:
            i = self._slot_of[name]
            self.fleet.healthy[i] = True
            self.fleet.mark(i)
        return name

    def _control(self, payload: Any, t: float) -> None:
        if payload is not None:  # a replica finished its cold start
            name = payload
            if name in self.book.replicas:
                self.book.mark_ready(name, t)
                i = self._slot_of[name]
                self.fleet.healthy[i] = True
                self.fleet.engines[i].model_loaded = True
                self.fleet.mark(i)
                self._release_queued(t)
            return
        self._tick(t)
        if t < self.horizon_s or self._live or self._pending_tasks or self.fleet_policy.held:
            self.events.push(t + self.tick_s, Event.CONTROL, None)

    # ---------------------------------------------------------------- signals
    def _update_tasks(self, t: float) -> None:
        while self._pending_tasks and self._pending_tasks[0].arrival_s <= t:
            spec = self._pending_tasks.popleft()
            self._arrivals.append(spec.arrival_s)
        while self._arrivals and self._arrivals[0] < t - 60.0:
            self._arrivals.popleft()
        for task in self._new_live(t):
            self._live[task.spec.task_id] = task
        for tid, task in list(self._live.items()):
            if task.status is not None:
                del self._live[tid]
                spec = task.spec
                acc = self._profile_sum.setdefault(spec.agent, [0.0, 0.0])
                acc[0] += max(task.done_calls, 1)
                acc[1] += (task.finished_s or t) - spec.arrival_s
                self._tasks_by_agent[spec.agent] = self._tasks_by_agent.get(spec.agent, 0) + 1

    def _new_live(self, t: float) -> list[TaskState]:
        out = []
        tasks = self.tasks
        i = self._live_cursor
        while i < len(tasks) and tasks[i].spec.arrival_s <= t:
            if tasks[i].status is None:
                out.append(tasks[i])
            i += 1
        self._live_cursor = i
        return out

    def _profiles(self) -> tuple[dict[str, AgentProfile], AgentProfile | None]:
        out: dict[str, AgentProfile] = {}
        gs = self._work_by_agent
        for agent, (calls, secs) in self._profile_sum.items():
            if calls >= 1:
                out[agent] = AgentProfile(gs.get(agent, 0.0) / max(self._calls_by_agent.get(agent, 1), 1),
                                          secs / calls, steps_per_task=calls / max(self._tasks_by_agent.get(agent, 1), 1))
        if not out:
            return out, None
        n = len(out)
        return out, AgentProfile(sum(p.work_per_step for p in out.values()) / n,
                                 sum(p.seconds_per_step for p in out.values()) / n,
                                 steps_per_task=sum(p.steps_per_task or 0.0 for p in out.values()) / n)

    def _steps_left(self, task: TaskState) -> int:
        """What a live planner knows of a task's calls still to come, its current one
        included: the SDK's hint where it sends one (``ClusterSpec.hints``), else the agent's
        mean task length from the tasks finished so far minus the calls made (as
        ``actuators.signals.history_signals`` reads it from Postgres); never the truth,
        unless the hints mode is the labelled oracle."""
        spec = task.spec
        hint = steps_hint(spec, task.done_calls - 1, self.cluster.hints)
        if hint is not None:
            return max(1, hint)
        agent = spec.agent
        tasks = self._tasks_by_agent.get(agent, 0)
        mean = self._profile_sum[agent][0] / tasks if tasks else DEFAULT_TASK_STEPS
        return max(1, round(mean - task.done_calls))

    def _signals(self, t: float) -> PoolSignals:
        self.fleet.snapshot()
        live_tokens: dict[str, int] = {}
        live_n: dict[str, int] = {}
        workflows = []
        homes = self.fleet_policy.homes
        for task in self._live.values():
            spec = task.spec
            remaining = self._steps_left(task)
            sid = spec.session_id or spec.task_id
            rep = homes.of(sid)
            own = max(0, task.ctx - spec.prefix_tokens)
            if rep is not None and remaining > 0:
                live_tokens[rep] = live_tokens.get(rep, 0) + own
                live_n[rep] = live_n.get(rep, 0) + 1
            workflows.append(WorkflowSignal(
                task_id=spec.task_id, agent=spec.agent, steps_remaining=remaining,
                budget_s=None if task.deadline_abs is None else task.deadline_abs - t, replica=rep,
                context_tokens=task.ctx))
        for name, r in self.book.replicas.items():
            i = self._slot_of[name]
            e = self.fleet.engines[i]
            r.num_running, r.num_waiting = e.num_running, e.num_waiting
            total = max(e.num_blocks, 1)
            r.kv_usage = 1.0 - self.fleet.views[i].kv_blocks_free / total
            r.live_session_tokens, r.live_sessions = live_tokens.get(name, 0), live_n.get(name, 0)
        profiles, default = self._profiles()
        return PoolSignals(
            pool=self.book.pool, now_s=t, replicas=list(self.book.replicas.values()), generations=self.generations,
            min_replicas=self.min_replicas, max_replicas=self.max_replicas,
            held_requests=len(self.fleet_policy.held), queued_requests=self.fleet_policy.queued, workflows=workflows,
            arrivals_per_s=len(self._arrivals) / 60.0, profiles=profiles, default_profile=default)

    # ---------------------------------------------------------------- acting
    def _tick(self, t: float) -> None:
        self._update_tasks(t)
        s = self._signals(t)
        plan: Plan = self.autoscaler.plan(s)
        acts = self.book.apply(plan, t)
        if not plan.empty:
            self.stats.decisions.append({"t": round(t, 1), "desired": plan.desired, "start": plan.start,
                                         "cordon": plan.cordon, "drain": plan.drain, "reasons": plan.reasons})
        for name, gpu in acts.start:
            self.stats.cold_starts += 1
            self.events.push(t + self.book.generations[gpu].cold_start_s, Event.CONTROL, name)
        for name in acts.unplaceable:
            self._leave(name, t)
        for name in acts.wake:
            self.stats.wakes += 1
            wake_s = self.book.generations[self.book.replicas[name].gpu].wake_s or 0.0
            self.events.push(t + wake_s, Event.CONTROL, name)
        for name, _kill in acts.stop:
            self._stop(name, t)
        for name, kill in self.book.due(t):
            if self.book.sleep_level and not kill:
                self._sleep(name, t)
            else:
                self._stop(name, t)
        rdy = [r for r in self.book.replicas.values() if r.phase is Phase.READY]
        n_ready = len(rdy)
        inflight = sum(r.inflight for r in self.book.replicas.values())
        if rdy:
            ms = self.stats.metric_sums
            ms[0] += (sum(r.num_waiting for r in rdy) + s.queued_requests) / n_ready
            ms[1] += (inflight + s.queued_requests) / n_ready
            ms[2] += sum(r.kv_usage for r in rdy) / n_ready
            ms[3] += 1
        tl = self.stats.timeline
        if not tl or tl[-1][1:] != (len(self.book.replicas), n_ready, inflight) or t - tl[-1][0] >= 30.0:
            tl.append((t, len(self.book.replicas), n_ready, inflight))

    def _leave(self, name: str, t: float) -> None:
        """No placement on ``name`` from now: its live sessions' context will be prefilled
        again elsewhere (counted here, once)."""
        i = self._slot_of[name]
        r = self.book.replicas.get(name)
        if r is not None:
            self.stats.reprefill_tokens_after_scale_in += r.live_session_tokens
        self.fleet.healthy[i] = False
        self.fleet.mark(i)

    def _sleep(self, name: str, t: float) -> None:
        """Drained: the replica sleeps (its slot stays paid for), its KV cache dropped."""
        i = self._slot_of[name]
        self.stats.sleeps += 1
        self.book.slept(name, t)
        eng = self.fleet.engines[i]
        eng.reset(t, why="aborted: engine put to sleep")
        self._engine_events(i, eng.advance(t), t)
        self._schedule_wake(i)
        self.fleet_policy.homes.forget_replica(name)

    def _stop(self, name: str, t: float) -> None:
        i = self._slot_of.pop(name, None)
        if i is None:
            return
        eng = self.fleet.engines[i]
        inflight = eng.num_running + eng.num_waiting
        self.stats.failed_inflight_calls += inflight
        r = self.book.replicas.get(name)
        reason = "killed" if inflight else "asleep too long" if r is not None and r.phase is Phase.SLEEPING else "drained"
        self.book.stopped(name, t, reason=reason, killed_inflight=inflight)
        self._outage(i, False, t)  # aborts what is left (retried elsewhere), clears its cache
        self.fleet_policy.homes.forget_replica(name)
        self._slot_free[self.fleet.views[i].gpu].append(i)

    # ---------------------------------------------------------------- result
    def run_fleet(self) -> FleetResult:
        res = self.run()
        end = max(self._now, self.horizon_s)
        return FleetResult(cluster=res, intervals=self.book.all_intervals(), stats=self.stats, horizon_s=end)

    def _record(self, call: SimCall, t: float, outcome: Outcome, error: str | None, *, replica: int = -1,
                ev: Finished | None = None, cost: float = 0.0) -> None:
        super()._record(call, t, outcome, error, replica=replica, ev=ev, cost=cost)
        if ev is not None:  # task history: work and calls per agent
            agent = call.task.spec.agent
            work = work_units(ev.prompt_tokens - ev.cached_tokens, ev.output_tokens)
            self._work_by_agent[agent] = self._work_by_agent.get(agent, 0.0) + work
            self._calls_by_agent[agent] = self._calls_by_agent.get(agent, 0) + 1


def fleet_cluster(generations: list[Generation], model: str, kv_blocks: int | None = None,
                  hints: HintMode = HintMode.AUTHOR) -> ClusterSpec:
    """Every slot the pool may use: ``max_replicas`` per generation."""
    reps = [ReplicaSpec(name=f"{g.gpu}-{i}", gpu=g.gpu, model=model, kv_blocks=kv_blocks,
                        cost_per_hour_usd=g.cost_per_hour_usd)
            for g in generations for i in range(g.max_replicas)]
    return ClusterSpec(reps, hints=hints)


def simulate_fleet(workload: Workload, policy: Policy, autoscaler: Autoscaler, options: FleetOptions, *,
                   model: str = "llama-3.1-8b", seed: int = 0, hints: HintMode = HintMode.AUTHOR) -> FleetResult:
    """Run ``workload`` on a pool of ``model`` replicas that ``autoscaler`` sizes within ``options``."""
    cluster = fleet_cluster(options.generations, model, hints=hints)
    return FleetSim(cluster, workload, policy, autoscaler, options, seed=seed).run_fleet()
