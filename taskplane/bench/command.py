"""``taskplane bench``: placement policies side by side on one workload, in one run.

Every policy replays exactly the same workload (same tasks, same arrival times, same
seed) on the same simulated fleet in the virtual-time cluster simulator; the figures
are computed from the records each run produces (see :mod:`taskplane.bench.metrics`).
Agent workloads are swept over loads relative to the fleet's measured capacity; trace
replays take the trace's own arrivals, compressed or stretched by ``time_scale``.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from taskplane.bench import plots
from taskplane.bench.ceiling import hit_ceiling, lru_bound
from taskplane.bench.machine import machine_info
from taskplane.bench.metrics import call_latencies, policy_metrics
from taskplane.bench.render import rich_table, write_results
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

WORKLOADS = ("agents", "mooncake")
DEFAULT_LOADS = (0.5, 1.0, 1.3)

PolicyFactory = Callable[[], Any]


# ------------------------------------------------------------------ options


def parse_policies(spec: str | None) -> list[str]:
    from taskplane.scheduler.policies import policy_names

    known = policy_names()
    if spec is None or spec.strip() in ("", "all"):
        return known
    names = [p.strip() for p in spec.split(",") if p.strip()]
    unknown = [p for p in names if p not in known]
    if unknown:
        raise UserError(f"unknown policy {', '.join(unknown)}; choose from {', '.join(known)} (or 'all')")
    return list(dict.fromkeys(names))


def parse_loads(spec: str | None) -> list[float]:
    if spec is None or not spec.strip():
        return list(DEFAULT_LOADS)
    try:
        loads = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--load takes comma-separated numbers like 0.5,1.0,1.3, got {spec!r}") from None
    if not loads or any(x <= 0 for x in loads):
        raise UserError(f"--load factors must be positive, got {spec!r}")
    return sorted(set(loads))


def build_cluster(replicas: int, fleet: str | None, tiers: TierSpec | None = None,
                  hints: str = "author") -> tuple[ClusterSpec, str]:
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


# ------------------------------------------------------------------ the suite


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
    *,
    workload: str,
    cluster: ClusterSpec,
    fleet: str,
    factories: dict[str, PolicyFactory],
    seed: int = 1,
    time_scale: float = 1.0,
    trace: Path | None = None,
    tasks: int | None = None,
    loads: list[float] | None = None,
    duration_s: float | None = None,
    progress: Progress | None = None,
    console: Console | None = None,
    capacity_per_s: float | None = None,
    capacity_cache: Path | None = None,
) -> tuple[dict[str, Any], list[Point]]:
    """Run the whole comparison; returns the results.json document and the points."""
    started = time.perf_counter()
    points: list[Point] = []
    capacity: Capacity | None = None
    info: dict[str, Any] = {}
    if workload == "agents":
        window = duration_s or DEFAULT_WINDOW_S
        tenants = agent_tenants()
        if capacity_per_s is not None:
            capacity = Capacity(capacity_per_s, "given", window)
        else:
            capacity = _cached_capacity(capacity_cache, fleet, seed, window, tasks)
        if capacity is None:
            status = console.status("measuring the fleet's capacity …") if console is not None else None
            if status is not None:
                status.start()
            try:
                capacity = measure_capacity(
                    cluster, seed=seed, window_s=window, tasks=tasks, tenants=tenants,
                    progress=(lambda msg: status.update(msg)) if status is not None else None)
            finally:
                if status is not None:
                    status.stop()
            _store_capacity(capacity_cache, fleet, seed, window, tasks, capacity)
        if console is not None:
            console.print(f"capacity of {fleet}: {capacity.tasks_per_s:.3f} tasks/s "
                          f"({capacity.reference_policy} at >= {capacity.slo_attainment:.0%} within deadline)")
        for load in loads or list(DEFAULT_LOADS):
            rate = load * capacity.tasks_per_s / time_scale
            wl = agent_workload(tasks_for(rate, window, tasks), rate, seed)
            points.append(Point(load=load, workload=wl, ceiling=hit_ceiling(wl), rate=rate))
        cfg = AgentWorkloadConfig()
        info = {"arrival_window_s": window if tasks is None else None,
                "tasks": ", ".join(str(len(p.workload.tasks)) for p in points),
                "calls": ", ".join(str(p.workload.num_calls) for p in points),
                "agents": ", ".join(a.name for a in cfg.agents),
                "tenants": ", ".join(f"{t.name} ({t.priority})" for t in cfg.tenants)}
        info = {k: v for k, v in info.items() if v is not None}
    else:
        wl = mooncake_workload(trace, time_scale=time_scale, duration_s=duration_s)
        points.append(Point(load=None, workload=wl, ceiling=hit_ceiling(wl),
                            lru=lru_bound(wl, fleet_kv_blocks(cluster, wl.block_size))))
        info = {"trace": str(trace) if trace else "mooncake_conversation_trace.jsonl",
                "requests": wl.num_calls, "sessions": len(wl.tasks)}
        if duration_s is not None:
            info["duration_s"] = duration_s
    for p in points:
        label = f"load {p.load}x · " if p.load is not None and len(points) > 1 else ""
        run_point(p, cluster, factories, seed=seed, progress=progress, label=label)

    head = points[-1]  # the highest load of a sweep
    described = _describe(factories)
    policies = {n: {**described.get(n, {}), **m} for n, m in head.policies.items()}
    results: dict[str, Any] = {
        "workload": workload,
        "replicas": len(cluster.replicas),
        "fleet": fleet,
        "seed": seed,
        "time_scale": time_scale,
        "hit_ceiling": round(head.ceiling, 5),
        "hit_lru_bound": None if head.lru is None else round(head.lru, 5),
        "load": head.load,
        "policies": policies,
        "targets": evaluate(workload, head.policies),
        "workload_info": info,
        # what the simulated SDK told the policies of the future; "exact" is an oracle: a bound
        "hints": cluster.hints.value,
        "oracle": cluster.hints.oracle,
    }
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


def _capacity_key(fleet: str, seed: int, window: float, tasks: int | None) -> dict[str, Any]:
    from taskplane.bench.workloads import CAPACITY_REFERENCES, SLO_ATTAINMENT

    return {"fleet": fleet, "seed": seed, "window_s": window, "tasks": tasks,
            "references": list(CAPACITY_REFERENCES), "slo_attainment": SLO_ATTAINMENT}


def _cached_capacity(path: Path | None, fleet: str, seed: int, window: float, tasks: int | None) -> Capacity | None:
    """A capacity measured earlier for the same fleet, seed and window (capacity.json)."""
    if path is None or not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        if doc.get("key") != _capacity_key(fleet, seed, window, tasks):
            return None
        return Capacity.from_dict(doc["capacity"])
    except (ValueError, KeyError, TypeError):
        return None


def _store_capacity(path: Path | None, fleet: str, seed: int, window: float, tasks: int | None,
                    capacity: Capacity) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": _capacity_key(fleet, seed, window, tasks),
                                "capacity": capacity.as_dict()}, indent=2) + "\n")


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


# ------------------------------------------------------------------ the command


def _run_scale(
    out: Path, *, replicas: int, tasks: int | None, policies: str | None, seed: int, engine: str, cells: int
) -> dict[str, Any]:
    """``--workload scale``: one policy at fleet scale (taskplane/bench/scale.py)."""
    from taskplane.bench.scale import run_scale_command

    if engine != "sim":
        raise UserError("--workload scale runs in the cluster simulator: use --engine sim")
    names = parse_policies(policies) if policies else ["taskplane"]
    if len(names) != 1:
        raise UserError("--workload scale measures one policy: give --policies NAME")
    if tasks is not None and tasks < 1:
        raise UserError("--tasks must be at least 1")
    if not 1 <= cells <= replicas:
        raise UserError(f"--cells must be between 1 and --replicas ({replicas}), got {cells}")
    return run_scale_command(out=out, replicas=replicas, tasks=tasks or 100_000, policy=names[0], seed=seed,
                             cells=cells)


def run_bench(
    out: Path,
    workload: str = "agents",
    trace: Path | None = None,
    replicas: int = 16,
    policies: str | None = None,
    seed: int = 1,
    time_scale: float = 1.0,
    engine: str = "sim",
    tasks: int | None = None,
    load: str | None = None,
    fleet: str | None = None,
    duration_s: float | None = None,
    cells: int = 1,
    host_kv_gb: float = 0.0,
    remote_kv_gb: float = 0.0,
    hints: str = "author",
    cold_start_s: float | None = None,
) -> dict[str, Any]:
    """The ``taskplane bench`` command (see the module docstring); returns results.json's content."""
    if workload not in (*WORKLOADS, "scale", "diurnal"):
        raise UserError(f"--workload must be one of {', '.join((*WORKLOADS, 'scale', 'diurnal'))}, got {workload!r}")
    if workload == "diurnal":  # autoscalers side by side (taskplane/bench/diurnal_command.py)
        from taskplane.bench.diurnal_command import run_diurnal_command

        return run_diurnal_command(out, replicas=replicas, policies=policies, seed=seed, trace=trace,
                                   day_s=duration_s or 3600.0, cold_start_s=cold_start_s, hints=hints)
    if workload == "scale":
        return _run_scale(out, replicas=replicas, tasks=tasks, policies=policies, seed=seed, engine=engine,
                          cells=cells)
    if cells != 1:
        raise UserError("--cells splits the fleet for --workload scale only")
    if engine == "vllm" and (host_kv_gb or remote_kv_gb):
        raise UserError("--host-kv-gb / --remote-kv-gb model KV tiers in the simulator: use them with --engine sim")
    if engine == "vllm":
        from taskplane.bench import real  # httpx, the vLLM launcher: only for --engine vllm

        return real.run_bench(out=out, workload=workload, trace=trace, replicas=replicas,
                              policies=policies, seed=seed, time_scale=time_scale, engine=engine,
                              tasks=tasks, load=load, fleet=fleet, duration_s=duration_s)
    if engine != "sim":
        raise UserError(f"--engine must be sim or vllm, got {engine!r}")
    if time_scale <= 0:
        raise UserError(f"--time-scale must be positive, got {time_scale}")
    if trace is not None and workload != "mooncake":
        raise UserError("--trace replays a Mooncake-format file: use it with --workload mooncake")
    if trace is not None and not trace.is_file():
        raise UserError(f"--trace {trace}: no such file")
    if tasks is not None and tasks < 1:
        raise UserError("--tasks must be at least 1")
    names = parse_policies(policies)
    loads = parse_loads(load) if workload == "agents" else []
    if host_kv_gb < 0 or remote_kv_gb < 0:
        raise UserError("--host-kv-gb and --remote-kv-gb must be >= 0")
    cluster, fleet_spec = build_cluster(replicas, fleet, TierSpec(host_kv_gb=host_kv_gb, remote_kv_gb=remote_kv_gb),
                                        hints)
    tenants = agent_tenants() if workload == "agents" else None
    factories = preset_factories(names, seed, tenants)

    console = Console()
    columns = (TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("calls"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        results, points = run_suite(workload=workload, cluster=cluster, fleet=fleet_spec, factories=factories,
                                    seed=seed, time_scale=time_scale, trace=trace, tasks=tasks, loads=loads,
                                    duration_s=duration_s, progress=progress, console=console,
                                    capacity_cache=out / "capacity.json")
    results["command"] = "taskplane " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else ""
    json_path, md_path = write_results(out, results)
    pngs = write_plots(out, workload, points)

    for p in points:
        title = f"{workload} on {fleet_spec}" + (f" — load {p.load}x" if p.load is not None else "")
        console.print(rich_table(title, p.policies))
    for t in results["targets"]:
        mark = "[green]met[/]" if t["met"] else "[red]not met[/]"
        console.print(f"target: {t['target']}: ratio {t['ratio']} ({mark})")
    console.print(f"wrote {json_path}, {md_path}, " + ", ".join(str(p) for p in pngs))
    return results
