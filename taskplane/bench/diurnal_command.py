"""The ``taskplane bench --workload diurnal`` command: results.json, results.md and a plot.

Steps: (1) the rate the fixed fleet of ``--replicas`` H100s serves within its SLO (probed
with the common placement policy); (2) a profile of that fleet at that rate (the planner's
capacity figure and the baselines' targets); (3) the day: every autoscaler on the same
warped workload; (4) the targets as ratios of this one run, and the clairvoyant bound.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from taskplane.autoscale.types import PREFILL_WEIGHT
from taskplane.bench.diurnal import (
    DayCurve,
    FleetBounds,
    autoscaler_metrics,
    default_generations,
    profile_fleet,
    run_autoscalers,
    tuned_baselines,
    warp_workload,
)
from taskplane.bench.options import BenchOptions
from taskplane.bench.workloads import agent_workload, mooncake_workload
from taskplane.sim.cluster import ClusterSpec, simulate
from taskplane.sim.workloads.base import Workload

AUTOSCALER_ORDER = ("fixed-peak", "hpa-queue", "dynamo-planner", "aibrix-kpa", "taskplane")
PROBE_WINDOW_S = 600.0
SLO = 0.95


def served_rate(replicas: int, policy_factory: Any, seed: int, console: Console | None = None) -> float:
    """The highest constant agent arrival rate (tasks/s) the fixed fleet serves with >= 95 %
    of deadlines met: doubling, then three bisections."""
    def ok(rate: float) -> bool:
        wl = agent_workload(max(10, round(rate * PROBE_WINDOW_S)), rate, seed)
        res = simulate(ClusterSpec.fleet(f"h100:{replicas}"), wl, policy_factory(), seed=seed)
        met = sum(1 for t in res.tasks if t.deadline_met) / max(len(res.tasks), 1)
        if console is not None:
            console.print(f"capacity probe {rate:.3f} tasks/s: deadline met {met:.3f}")
        return met >= SLO

    lo, hi = 0.05 * replicas, 0.1 * replicas
    while ok(hi):
        lo, hi = hi, hi * 2
    for _ in range(3):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def diurnal_workload(rate: float, curve: DayCurve, seed: int, trace: Path | None) -> Workload:
    """Agent tasks at ``rate`` x the curve, or the trace's arrivals bent onto the curve."""
    if trace is None:
        n = int(rate * curve.mean() * curve.day_s)
        return warp_workload(agent_workload(n, rate, seed + 1), curve)
    wl = mooncake_workload(trace)
    span = max((c.at_s or 0.0 for t in wl.tasks for c in t.calls), default=1.0) or 1.0
    return warp_workload(wl, curve, scale=curve.mean() * curve.day_s / span)  # the trace's span fills the day


def targets(auto: dict[str, dict[str, Any]], prefill_rate: float) -> list[dict[str, Any]]:
    """The autoscaler's targets as ratios of this one run. ``prefill_rate``: one replica's
    profiled work units per second, which prices re-prefilled tokens in GPU-hours."""
    tp = auto.get("taskplane")
    if tp is None:
        return []
    base = {k: v for k, v in auto.items() if k != "taskplane"}
    out: list[dict[str, Any]] = []
    best = max((v["goodput_per_gpu_hour"] or 0.0 for v in base.values()), default=0.0)
    if best:
        r = (tp["goodput_per_gpu_hour"] or 0.0) / best
        out.append({"target": "goodput per GPU-hour >= 1.10x best baseline, deadline-met >= 95%",
                    "ratio": round(r, 3), "met": r >= 1.10 and (tp["deadline_met_ratio"] or 0) >= 0.95})
    fp = base.get("fixed-peak")
    if fp and fp["fleet_cost_per_successful_task_usd"]:
        r = (tp["fleet_cost_per_successful_task_usd"] or math.inf) / fp["fleet_cost_per_successful_task_usd"]
        out.append({"target": "fleet cost per successful task <= 0.6x fixed-peak", "ratio": round(r, 3),
                    "met": r <= 0.6})
    out.append({"target": "0 failed calls in flight at scale-in", "ratio": tp["failed_inflight_calls"],
                "met": tp["failed_inflight_calls"] == 0})
    # re-prefill is priced, not capped: the GPU-hours it costs, as a share of the fleet's
    reprefill_h = tp["reprefill_tokens_after_scale_in"] * PREFILL_WEIGHT / max(prefill_rate, 1e-9) / 3600.0
    share = reprefill_h / tp["gpu_hours"] if tp["gpu_hours"] else 0.0
    out.append({"target": "re-prefill after scale-in <= 2% of the fleet's GPU-hours", "ratio": round(share, 4),
                "met": share <= 0.02})
    return out


def bounds(auto: dict[str, dict[str, Any]], curve: DayCurve, served_replicas: int) -> dict[str, Any]:
    """What a clairvoyant fleet needs (``DayCurve.clairvoyant_gpu_hours``) for taskplane's
    successes: how far any autoscaler that keeps the profiled per-replica load could go."""
    tp = auto.get("taskplane")
    if tp is None or not tp["tasks_succeeded"]:
        return {}
    gpu_h = curve.clairvoyant_gpu_hours(served_replicas)
    goodput = tp["tasks_succeeded"] / gpu_h
    best = max((v["goodput_per_gpu_hour"] or 0.0 for k, v in auto.items() if k != "taskplane"), default=0.0)
    return {"clairvoyant_gpu_hours": round(gpu_h, 4), "clairvoyant_goodput_per_gpu_hour": round(goodput, 3),
            "clairvoyant_vs_best_baseline": round(goodput / best, 3) if best else None,
            "taskplane_vs_clairvoyant": round((tp["goodput_per_gpu_hour"] or 0.0) / goodput, 3)}


def write_plot(out: Path, curve: DayCurve, rate: float, results: dict[str, Any]) -> Path:
    from taskplane.bench.plots import _colors, _figure, _style

    fig = _figure(8.5, 4.6)
    ax = fig.add_subplot(1, 1, 1)
    colors = _colors(list(results))
    for name, res in results.items():
        tl = res.stats.timeline
        xs = [t / 60.0 for t, *_ in tl] + [res.horizon_s / 60.0]
        ys = [p for _, p, _, _ in tl] + [tl[-1][1] if tl else 0]
        ax.step(xs, ys, where="post", label=name, color=colors[name], lw=2.2 if name == "taskplane" else 1.3)
    ax.set_xlabel("virtual minutes")
    ax.set_ylabel("replicas provisioned")
    _style(ax)
    ax2 = ax.twinx()
    ts = [i * 10.0 for i in range(int(curve.day_s / 10))]
    ax2.plot([t / 60 for t in ts], [rate * curve.rate(t) for t in ts], color="#111827", ls=":", label="arrivals")
    ax2.set_ylabel("task arrivals per second (dotted)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = out / "diurnal_replicas.png"
    fig.savefig(path)
    return path


def run_diurnal_command(options: BenchOptions) -> dict[str, Any]:
    """``--workload diurnal``: the steps of the module docstring for ``options.replicas`` H100s
    over a day of ``options.duration_s`` (default an hour); ``options.cold_start_s``: every
    replica's provisioning to first placement (None: the GPU's and model's default);
    ``options.hints``: the steps hints the simulated SDK sends (sim/hints.py)."""
    from taskplane.scheduler.policies import build_policy
    from taskplane.sim.hints import HintMode

    out, replicas, seed, trace = options.out, options.replicas, options.seed, options.trace
    day_s = options.duration_s or 3600.0
    console = Console()
    placement = (options.policies or "taskplane").split(",")[0]

    def factory() -> Any:
        return build_policy(placement, seed=seed, metrics=False)

    out.mkdir(parents=True, exist_ok=True)
    rate = served_rate(replicas, factory, seed, console)
    profile = profile_fleet(agent_workload(round(rate * PROBE_WINDOW_S), rate, seed), replicas, factory(),
                            window_s=PROBE_WINDOW_S, seed=seed)
    console.print(f"fleet profile at {rate:.3f} tasks/s: {profile}")
    curve = DayCurve(day_s=day_s)
    wl = diurnal_workload(rate, curve, seed, trace)
    fixed = math.ceil(replicas * curve.peak)
    gens = default_generations(f"h100:{2 * replicas}", wl.tasks[0].model, profile["capacity_per_s"],
                               cold_start_s=options.cold_start_s)
    mode = HintMode.parse(options.hints)
    fleet = FleetBounds(generations=gens, min_replicas=1, max_replicas=2 * replicas, fixed=fixed, horizon_s=day_s,
                        seed=seed, hints=mode)
    res = run_autoscalers(wl, list(AUTOSCALER_ORDER), factory, fleet, tuned=tuned_baselines(profile),
                          progress=console.print)
    auto = {n: autoscaler_metrics(r, 1.0) for n, r in res.items()}
    results: dict[str, Any] = {
        "workload": "diurnal", "trace": str(trace) if trace else None, "replicas": replicas, "seed": seed,
        "placement_policy": placement, "served_rate_per_s": round(rate, 5), "fixed_peak_replicas": fixed,
        "max_replicas": 2 * replicas, "cold_start_s": gens[0].cold_start_s, "hints": mode.value,
        "oracle": mode.oracle, "day": {"day_s": day_s, "trough": curve.trough, "peak": curve.peak,
                                               "ramp_s": curve.ramp_s, "peak_s": curve.peak_s},
        "tasks": len(wl.tasks), "profile": {k: round(v, 4) if isinstance(v, float) else v for k, v in profile.items()},
        "autoscalers": auto, "targets": targets(auto, profile["capacity_per_s"]), "bounds": bounds(auto, curve, replicas),
        "decisions": {n: r.stats.decisions[:200] for n, r in res.items()},
        "command": "taskplane " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    lines = results_markdown(results)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    png = write_plot(out, curve, rate, res)
    console.print("\n".join(lines))
    console.print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {png}")
    return results


def results_markdown(results: dict[str, Any]) -> list[str]:
    """results.md's lines: one row per autoscaler, the targets, the clairvoyant bound."""
    lines = ["| autoscaler | GPU-h | goodput/GPU-h | deadline met | fleet $/ok task | failed in flight | re-prefill tokens | cold starts |",
             "|---|---|---|---|---|---|---|---|"]
    for n, m in results["autoscalers"].items():
        lines.append(f"| {n} | {m['gpu_hours']} | {m['goodput_per_gpu_hour']} | {m['deadline_met_ratio']} | "
                     f"{m['fleet_cost_per_successful_task_usd']} | {m['failed_inflight_calls']} | "
                     f"{m['reprefill_tokens_after_scale_in']} | {m['cold_starts']} |")
    lines += ["", *(f"- {t['target']}: ratio {t['ratio']} ({'met' if t['met'] else 'not met'})" for t in results["targets"])]
    if results["bounds"]:
        b = results["bounds"]
        lines.append(f"- clairvoyant fleet (knows the curve, no cold start, replicas at the profiled rate): "
                     f"{b['clairvoyant_gpu_hours']} GPU-h, goodput/GPU-h {b['clairvoyant_goodput_per_gpu_hour']} "
                     f"({b['clairvoyant_vs_best_baseline']}x the best baseline; taskplane "
                     f"{b['taskplane_vs_clairvoyant']}x of it)")
    return lines
