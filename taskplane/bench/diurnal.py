"""``taskplane bench --workload diurnal``: autoscalers side by side on a day-shaped load.

The agent mix (or a Mooncake-format trace, ``--trace``) arrives along a day curve: a trough
of ``trough`` x and a peak of ``peak`` x the rate a fixed fleet of ``--replicas`` serves
within its SLO, joined by ramps of minutes, compressed into ``day_s`` virtual seconds.
Arrival times are *warped*: a task generated at time ``u`` of a constant-rate stream
arrives at ``t`` where the curve's cumulative intensity reaches ``u`` (so the trace keeps
its own sessions and order, only its clock bends). Every autoscaler runs the same workload
with the same placement policy (``--policies``' first, default taskplane): the autoscaler
is what differs.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from typing import Any

from taskplane.autoscale.baselines import (
    AibrixKpa,
    DynamoConfig,
    DynamoPlanner,
    FixedPeak,
    HpaConfig,
    HpaQueue,
    KpaConfig,
)
from taskplane.autoscale.registry import Autoscaler, build_autoscaler
from taskplane.autoscale.types import Generation, work_units
from taskplane.bench.metrics import policy_metrics
from taskplane.sim.elastic import FleetOptions, FleetResult, generation, simulate_fleet
from taskplane.sim.hints import HintMode
from taskplane.sim.workloads.base import Workload
from taskplane.store.records import Outcome, TaskStatus


@dataclass(frozen=True, slots=True)
class DayCurve:
    """Rate multiplier over a compressed day: trough, ramp up, peak, ramp down, trough."""

    day_s: float = 3600.0
    trough: float = 0.1
    peak: float = 1.3
    ramp_s: float = 600.0  # each ramp
    peak_s: float = 900.0  # the plateau at the peak

    def rate(self, t: float) -> float:
        x = t % self.day_s
        trough_s = (self.day_s - 2 * self.ramp_s - self.peak_s) / 2
        if x < trough_s:
            return self.trough
        x -= trough_s
        if x < self.ramp_s:  # cosine ramps: no step anywhere
            return self.trough + (self.peak - self.trough) * (1 - math.cos(math.pi * x / self.ramp_s)) / 2
        x -= self.ramp_s
        if x < self.peak_s:
            return self.peak
        x -= self.peak_s
        if x < self.ramp_s:
            return self.peak - (self.peak - self.trough) * (1 - math.cos(math.pi * x / self.ramp_s)) / 2
        return self.trough

    def mean(self, step_s: float = 1.0) -> float:
        n = int(self.day_s / step_s)
        return sum(self.rate((i + 0.5) * step_s) for i in range(n)) / n

    def clairvoyant_gpu_hours(self, served_replicas: float, min_replicas: int = 1, step_s: float = 1.0) -> float:
        """GPU-hours of a fleet that knows the curve and starts replicas with no cold start:
        at every instant the fewest whole replicas that carry the load at the per-replica rate
        the fixed fleet of ``served_replicas`` serves within its SLO. An autoscaler that runs
        replicas no hotter than that profile cannot use fewer."""
        n = int(self.day_s / step_s)
        need = (max(min_replicas, math.ceil(served_replicas * self.rate((i + 0.5) * step_s) - 1e-9)) for i in range(n))
        return sum(need) * step_s / 3600.0

    def warp(self, times: list[float], base_rate: float, step_s: float = 1.0) -> list[float]:
        """Map arrival times of a ``base_rate`` stream onto the curve (x ``base_rate``)."""
        n = int(self.day_s / step_s)
        cum = [0.0]
        for i in range(n):
            cum.append(cum[-1] + self.rate((i + 0.5) * step_s) * step_s)
        out = []
        for u in times:
            target = u * 1.0  # intensity units: the stream at 1x has base_rate per second
            k = bisect.bisect_left(cum, target)
            if k > n:
                out.append(self.day_s + (target - cum[-1]) / max(self.trough, 1e-9))
                continue
            lo = cum[k - 1] if k > 0 else 0.0
            seg = cum[k] - lo if k > 0 else 1.0
            out.append((k - 1 + (target - lo) / seg) * step_s if k > 0 else 0.0)
        return out


def warp_workload(wl: Workload, curve: DayCurve, scale: float = 1.0) -> Workload:
    """The same tasks on the curve: a closed-loop task's arrival is warped (its steps keep
    their own pace); every open-loop (trace) call's time is warped on its own, so the
    trace's request density follows the curve. ``scale`` first stretches the clock."""
    tasks = sorted(wl.tasks, key=lambda t: t.arrival_s)
    warped_arrivals = curve.warp([t.arrival_s * scale for t in tasks], 1.0)
    out = []
    for spec, new in zip(tasks, warped_arrivals, strict=True):
        calls = spec.calls
        if spec.open_loop:
            times = curve.warp([(c.at_s if c.at_s is not None else spec.arrival_s) * scale for c in calls], 1.0)
            calls = [replace(c, at_s=t) for c, t in zip(calls, times, strict=True)]
            new = min(times) if times else new
        out.append(replace(spec, arrival_s=new, calls=calls))
    out.sort(key=lambda t: t.arrival_s)
    return Workload(name=f"{wl.name}-diurnal", tasks=out, block_size=wl.block_size, meta={**wl.meta, "diurnal": True})


def autoscaler_metrics(res: FleetResult, hit_ceiling: float) -> dict[str, Any]:
    """The results.json ``autoscalers`` entry of one run (and the policy figures beside it)."""
    m = policy_metrics(res.cluster, hit_ceiling=hit_ceiling)
    tasks = res.cluster.tasks
    met = sum(1 for t in tasks if t.status is TaskStatus.SUCCEEDED and t.deadline_met is not False)
    gpu_h = res.gpu_hours
    cost = res.fleet_cost_usd
    return {
        "gpu_hours": round(gpu_h, 4),
        "goodput_per_gpu_hour": round(met / gpu_h, 3) if gpu_h else None,
        "deadline_met_ratio": round(met / len(tasks), 4) if tasks else None,
        "fleet_cost_per_successful_task_usd": round(cost / met, 6) if met else None,
        "failed_inflight_calls": res.stats.failed_inflight_calls,
        "reprefill_tokens_after_scale_in": res.stats.reprefill_tokens_after_scale_in,
        "cold_starts": res.stats.cold_starts,
        "fleet_cost_usd": round(cost, 4),
        "tasks": len(tasks),
        "tasks_succeeded": met,
        "idle_gpu_hours": round(max(0.0, gpu_h - m["busy_gpu_seconds"] / 3600.0), 4),
        "prefix_hit_ratio": m["prefix_hit_ratio"],
        "ttft_p50_ms": m["ttft_p50_ms"],
        "ttft_p99_ms": m["ttft_p99_ms"],
        "peak_replicas": max((p for _, p, _, _ in res.stats.timeline), default=0),
        "decisions": len(res.stats.decisions),
    }


@dataclass(frozen=True, kw_only=True)
class FleetBounds:
    """What every autoscaler of one diurnal run gets: the generations it may provision, its
    replica bounds, the fixed-peak baseline's size, the simulated horizon, seed and hints."""

    generations: list[Generation]
    min_replicas: int
    max_replicas: int
    fixed: int  # replicas of the fixed-peak baseline
    horizon_s: float
    seed: int
    hints: HintMode = HintMode.AUTHOR  # what the simulated SDK tells placement and the planner of steps left


def run_autoscalers(workload: Workload, names: list[str], policy_factory: Any, bounds: FleetBounds, *,
                    progress: Any = None, tuned: dict[str, Autoscaler] | None = None) -> dict[str, FleetResult]:
    """Each autoscaler on the same workload within the same ``bounds``, a fresh placement policy each."""
    out: dict[str, FleetResult] = {}
    for name in names:
        if progress is not None:
            progress(f"diurnal: {name}")
        scaler = FixedPeak(bounds.fixed) if name == "fixed-peak" else (tuned or {}).get(name) or build_autoscaler(name)
        initial = bounds.fixed if name == "fixed-peak" else max(bounds.min_replicas, 1)
        pool = FleetOptions(generations=bounds.generations, min_replicas=bounds.min_replicas,
                            max_replicas=bounds.max_replicas, initial=initial, horizon_s=bounds.horizon_s)
        out[name] = simulate_fleet(workload, policy_factory(), scaler, pool, seed=bounds.seed, hints=bounds.hints,
                                   model=workload.tasks[0].model if workload.tasks else "llama-3.1-8b")
    return out


def default_generations(fleet: str, model: str, capacity_per_s: float,
                        cold_start_s: float | None = None) -> list[Generation]:
    """``"h100:16"`` or ``"h100:16,l40s:8"``: each generation with its slot count;
    ``cold_start_s``: every generation's (None: each GPU's and model's default)."""
    gens = []
    for part in fleet.split(","):
        gpu, _, count = part.strip().partition(":")
        gens.append(generation(gpu, model, max_replicas=int(count or 1), capacity_per_s=capacity_per_s,
                               cold_start_s=cold_start_s))
    return gens


def profile_fleet(workload: Workload, replicas: int, policy: Any, *, window_s: float, seed: int,
                  model: str = "llama-3.1-8b") -> dict[str, Any]:
    """A fixed H100 fleet of ``replicas`` on a constant-rate workload at the rate it serves
    within its SLO: work units per replica-second (the planner's capacity figure, profiled
    once like Dynamo's pre-deployment sweep) and the baselines' metrics at that load, which
    become their targets (each baseline is tuned to hold exactly this fleet at this load)."""
    gens = [generation("h100", model, max_replicas=replicas, capacity_per_s=1.0)]
    pool = FleetOptions(generations=gens, min_replicas=replicas, max_replicas=replicas, initial=replicas,
                        horizon_s=window_s)
    res = simulate_fleet(workload, policy, FixedPeak(replicas), pool, seed=seed, model=model)
    calls = res.cluster.calls
    work = sum(work_units(c.prompt_tokens - c.cached_tokens, c.completion_tokens)
               for c in calls if c.outcome is Outcome.SUCCESS)
    tasks = res.cluster.tasks
    met = sum(1 for t in tasks if t.deadline_met) / max(len(tasks), 1)
    ms = res.stats.metric_sums
    n = max(ms[3], 1.0)
    return {"capacity_per_s": work / (replicas * window_s), "deadline_met_ratio": round(met, 4),
            "tasks": len(tasks), "waiting_per_replica": ms[0] / n, "concurrency_per_replica": ms[1] / n,
            "kv_usage": ms[2] / n}


def tuned_baselines(profile: dict[str, Any]) -> dict[str, Autoscaler]:
    """The baselines with their targets set from a fixed fleet's profile (see profile_fleet)."""
    kv = min(0.95, max(0.05, profile["kv_usage"]))
    return {
        "hpa-queue": HpaQueue(HpaConfig(target_waiting_per_replica=max(0.05, profile["waiting_per_replica"]))),
        "dynamo-planner": DynamoPlanner(DynamoConfig(kv_scale_up=kv, kv_scale_down=kv * 0.6,
                                                     queue_scale_up=max(0.1, profile["waiting_per_replica"] * 1.5),
                                                     queue_scale_down=profile["waiting_per_replica"] * 0.3)),
        "aibrix-kpa": AibrixKpa(KpaConfig(target_concurrency=max(0.5, profile["concurrency_per_replica"]))),
    }
