"""The policy comparison of ``taskplane bench --workload agents|mooncake``, in the simulator.

Every policy replays exactly the same workload (same tasks, same arrival times, same
seed) on the same simulated fleet in the virtual-time cluster simulator; the figures
are computed from the records each run produces (see :mod:`taskplane.bench.metrics`).
Agent workloads are swept over loads relative to the fleet's measured capacity; trace
replays take the trace's own arrivals, compressed or stretched by ``time_scale``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress

from taskplane.bench import plots
from taskplane.bench.ceiling import hit_ceiling, lru_bound
from taskplane.bench.machine import machine_info
from taskplane.bench.metrics import call_latencies, policy_metrics
from taskplane.bench.options import BenchOptions, parse_loads
from taskplane.bench.runner import run_policy
from taskplane.bench.targets import evaluate
from taskplane.bench.tiers import tier_metrics
from taskplane.bench.workloads import (
    DEFAULT_WINDOW_S,
    AgentWorkloadConfig,
    Capacity,
    agent_tenants,
    agent_workload,
    measure_capacity,
    mooncake_workload,
    tasks_for,
)
from taskplane.errors import UserError
from taskplane.scheduler.kv.lifetimes import LifetimePlanner
from taskplane.sim.cluster import ClusterSpec
from taskplane.sim.hosttier import TierSpec
from taskplane.sim.workloads.base import Workload

PolicyFactory = Callable[[], Any]


def build_cluster(replicas: int, fleet: str | None, tiers: TierSpec | None = None,
                  hints: str = "author") -> tuple[ClusterSpec, str]:
    """The simulated fleet of ``--fleet`` (default: ``replicas`` H100s) and its spec string."""
    spec = fleet or f"h100:{replicas}"
    try:
        cluster = ClusterSpec.fleet(spec, hints=hints)
        if tiers is not None:
            cluster.tiers = tiers
    except ValueError as exc:
        raise UserError(f"--fleet {spec!r}: {exc} (format: gpu:count,gpu:count, e.g. h100:8,l40s:8)") from None
    if not cluster.replicas:
        raise UserError(f"--fleet {spec!r} has no replicas")
    return cluster, spec


@dataclass
class Point:
    """One workload (one load factor) run under every policy."""

    load: float | None
    workload: Workload
    ceiling: float
    rate: float | None = None
    lru: float | None = None  # one LRU cache of the fleet's whole KV memory (traces only)
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    ttfts: dict[str, np.ndarray] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"load": self.load, "hit_ceiling": round(self.ceiling, 5)}
        if self.lru is not None:
            d["hit_lru_bound"] = round(self.lru, 5)
        if self.rate is not None:
            d["arrival_rate_per_s"] = round(self.rate, 5)
        d["tasks"] = len(self.workload.tasks)
        d["calls"] = self.workload.num_calls
        d["policies"] = self.policies
        return d


def fleet_kv_blocks(cluster: ClusterSpec, block_size: int) -> int:
    """KV blocks of the whole fleet (what vLLM would allocate on each replica)."""
    from taskplane.sim.gpus import default_kv_blocks

    return sum(r.kv_blocks or default_kv_blocks(r.gpu, r.model, block_size) for r in cluster.replicas)


def preset_factories(names: Iterable[str], seed: int, tenants: Any = None) -> dict[str, PolicyFactory]:
    from taskplane.scheduler.policies import build_policy

    def factory(name: str) -> PolicyFactory:
        return lambda: build_policy(name, seed=seed, tenants=tenants, metrics=False)

    return {n: factory(n) for n in names}


def run_point(
    point: Point,
    cluster: ClusterSpec,
    factories: dict[str, PolicyFactory],
    *,
    seed: int,
    progress: Progress | None = None,
    label: str = "",
) -> Point:
    """Run every policy on ``point.workload``; fills ``point.policies`` and ``point.ttfts``."""
    total = point.workload.num_calls
    for name, make in factories.items():
        task_id = None
        if progress is not None:
            task_id = progress.add_task(f"{label}{name}", total=total)

        def tick(done: int, task_id: Any = task_id) -> None:
            if progress is not None and task_id is not None:
                progress.update(task_id, completed=min(done, total))

        run = run_policy(make(), point.workload, cluster, seed=seed, progress=tick, kv_lifetimes=lifetimes_for(name))
        lat = call_latencies(run.result)
        point.policies[name] = policy_metrics(run.result, hit_ceiling=point.ceiling, decision_ns=run.decision_ns,
                                              wall_s=round(run.wall_s, 2), latencies=lat,
                                              decision_cpu_ns=run.decision_cpu_ns, cpu_s=run.cpu_s)
        point.policies[name].update(tier_metrics(run.result, point.workload))
        point.ttfts[name] = lat[0]
        if progress is not None and task_id is not None:
            progress.update(task_id, completed=total)
    return point


def lifetimes_for(name: str) -> LifetimePlanner | None:
    """The KV-lifetime planner of a preset that has one (a fresh one per run)."""
    from taskplane.scheduler.policies import PRESETS

    preset = PRESETS.get(name)
    return LifetimePlanner() if preset is not None and preset.kv_lifetimes else None


def _describe(names: Iterable[str]) -> dict[str, dict[str, str]]:
    from taskplane.scheduler.policies import PRESETS

    return {n: {"rule": PRESETS[n].summary, "source": PRESETS[n].source} for n in names if n in PRESETS}


def run_suite(
    options: BenchOptions,
    cluster: ClusterSpec,
    fleet: str,
    factories: dict[str, PolicyFactory],
    *,
    progress: Progress | None = None,
    console: Console | None = None,
    capacity_per_s: float | None = None,
    capacity_cache: Path | None = None,
) -> tuple[dict[str, Any], list[Point]]:
    """Run the whole comparison; returns the results.json document and the points.

    ``capacity_per_s`` skips the agents' capacity measurement; ``capacity_cache`` reuses a
    capacity measured earlier for the same fleet, seed and window (and stores a new one)."""
    started = time.perf_counter()
    capacity: Capacity | None = None
    if options.workload == "agents":
        window = options.duration_s or DEFAULT_WINDOW_S
        if capacity_per_s is not None:
            capacity = Capacity(capacity_per_s, "given", window)
        else:
            capacity = fleet_capacity(options, cluster, fleet, console=console, cache=capacity_cache)
        if console is not None:
            console.print(f"capacity of {fleet}: {capacity.tasks_per_s:.3f} tasks/s "
                          f"({capacity.reference_policy} at >= {capacity.slo_attainment:.0%} within deadline)")
        points, info = agent_points(options, capacity)
    else:
        points, info = trace_points(options, cluster)
    for p in points:
        label = f"load {p.load}x · " if p.load is not None and len(points) > 1 else ""
        run_point(p, cluster, factories, seed=options.seed, progress=progress, label=label)
    results = suite_results(options, cluster, fleet, factories, points)
    results["workload_info"] = info
    results["hints"] = cluster.hints.value  # what the simulated SDK told the policies of the future
    results["oracle"] = cluster.hints.oracle  # "exact" is an oracle: a bound
    if cluster.tiers.enabled:
        results["kv_tiers"] = {"host_kv_gb": cluster.tiers.host_kv_gb, "remote_kv_gb": cluster.tiers.remote_kv_gb,
                               "pcie_gb_per_s": cluster.tiers.pcie_bytes_per_s / 1e9,
                               "network_gb_per_s": cluster.tiers.network_bytes_per_s / 1e9}
    if capacity is not None:
        results["capacity"] = capacity.as_dict()
        results["sweep"] = [p.as_dict() for p in points]
    results["machine"] = machine_info()
    results["generated_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    results["wall_s"] = round(time.perf_counter() - started, 1)
    return results, points


def fleet_capacity(options: BenchOptions, cluster: ClusterSpec, fleet: str, *, console: Console | None,
                   cache: Path | None) -> Capacity:
    """The agents' capacity of the fleet: from ``cache`` when measured before, else measured
    (with a spinner on ``console``) and stored there."""
    window = options.duration_s or DEFAULT_WINDOW_S
    key = _capacity_key(fleet, options.seed, window, options.tasks)
    capacity = _cached_capacity(cache, key)
    if capacity is not None:
        return capacity
    status = console.status("measuring the fleet's capacity …") if console is not None else None
    if status is not None:
        status.start()
    try:
        capacity = measure_capacity(
            cluster, seed=options.seed, window_s=window, tasks=options.tasks, tenants=agent_tenants(),
            progress=(lambda msg: status.update(msg)) if status is not None else None)
    finally:
        if status is not None:
            status.stop()
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"key": key, "capacity": capacity.as_dict()}, indent=2) + "\n")
    return capacity


def agent_points(options: BenchOptions, capacity: Capacity) -> tuple[list[Point], dict[str, Any]]:
    """One agent workload per load factor of the sweep, and what the results say of them."""
    window = options.duration_s or DEFAULT_WINDOW_S
    points: list[Point] = []
    for load in parse_loads(options.load):
        rate = load * capacity.tasks_per_s / options.time_scale
        wl = agent_workload(tasks_for(rate, window, options.tasks), rate, options.seed)
        points.append(Point(load=load, workload=wl, ceiling=hit_ceiling(wl), rate=rate))
    cfg = AgentWorkloadConfig()
    info = {"arrival_window_s": window if options.tasks is None else None,
            "tasks": ", ".join(str(len(p.workload.tasks)) for p in points),
            "calls": ", ".join(str(p.workload.num_calls) for p in points),
            "agents": ", ".join(a.name for a in cfg.agents),
            "tenants": ", ".join(f"{t.name} ({t.priority})" for t in cfg.tenants)}
    return points, {k: v for k, v in info.items() if v is not None}


def trace_points(options: BenchOptions, cluster: ClusterSpec) -> tuple[list[Point], dict[str, Any]]:
    """The one trace replay (``--trace``, default the Mooncake conversation trace)."""
    trace = options.trace
    wl = mooncake_workload(trace, time_scale=options.time_scale, duration_s=options.duration_s)
    point = Point(load=None, workload=wl, ceiling=hit_ceiling(wl),
                  lru=lru_bound(wl, fleet_kv_blocks(cluster, wl.block_size)))
    info: dict[str, Any] = {"trace": str(trace) if trace else "mooncake_conversation_trace.jsonl",
                            "requests": wl.num_calls, "sessions": len(wl.tasks)}
    if options.duration_s is not None:
        info["duration_s"] = options.duration_s
    return [point], info


def suite_results(options: BenchOptions, cluster: ClusterSpec, fleet: str, factories: Iterable[str],
                  points: list[Point]) -> dict[str, Any]:
    """results.json's head: the run and, at the highest load of a sweep, every policy's figures."""
    head = points[-1]
    described = _describe(factories)
    return {
        "workload": options.workload,
        "replicas": len(cluster.replicas),
        "fleet": fleet,
        "seed": options.seed,
        "time_scale": options.time_scale,
        "hit_ceiling": round(head.ceiling, 5),
        "hit_lru_bound": None if head.lru is None else round(head.lru, 5),
        "load": head.load,
        "policies": {n: {**described.get(n, {}), **m} for n, m in head.policies.items()},
        "targets": evaluate(options.workload, head.policies),
    }


def _capacity_key(fleet: str, seed: int, window: float, tasks: int | None) -> dict[str, Any]:
    from taskplane.bench.workloads import CAPACITY_REFERENCES, SLO_ATTAINMENT

    return {"fleet": fleet, "seed": seed, "window_s": window, "tasks": tasks,
            "references": list(CAPACITY_REFERENCES), "slo_attainment": SLO_ATTAINMENT}


def _cached_capacity(path: Path | None, key: dict[str, Any]) -> Capacity | None:
    """A capacity measured earlier under the same ``key`` (capacity.json)."""
    if path is None or not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        if doc.get("key") != key:
            return None
        return Capacity.from_dict(doc["capacity"])
    except (ValueError, KeyError, TypeError):
        return None


def write_plots(out: Path, workload: str, points: list[Point]) -> list[Path]:
    head = points[-1]
    suffix = f" at {head.load}x load" if head.load is not None else ""
    files = [
        plots.ttft_cdf(out / "ttft_cdf.png", head.ttfts, f"TTFT per policy — {workload}{suffix}"),
        plots.hit_ratio_bars(out / "hit_ratio.png", head.policies, head.ceiling,
                             f"prefix-hit ratio vs infinite-cache ceiling — {workload}{suffix}", lru=head.lru),
    ]
    if workload == "agents":
        sweep = [{"load": p.load, "policies": p.policies} for p in points]
        files.append(plots.deadline_vs_load(out / "deadline_vs_load.png", sweep,
                                            "tasks within deadline vs load — agents"))
    return files
