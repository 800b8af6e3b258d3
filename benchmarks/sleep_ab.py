"""vLLM sleep mode in the autoscaler, side by side in one run: taskplane's planner on the
diurnal day (the workload and fleet of ``taskplane bench --workload diurnal``) with scale-in
victims stopped (sleep level 0, today's default) or put to sleep (levels 1 and 2), in the
virtual-time cluster simulator. Prints one table (GPU-hours, cold starts, wakes, deadline
met, goodput per GPU-hour, TTFT p99) and writes it as JSON.

    .venv/bin/python -m benchmarks.sleep_ab --replicas 4 --day-s 1800 --days 2 --sleep-max-s 600,1800
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

from taskplane.autoscale.planner import PlannerConfig, TaskplaneAutoscaler
from taskplane.bench.diurnal import DayCurve, autoscaler_metrics, default_generations, profile_fleet
from taskplane.bench.diurnal_command import PROBE_WINDOW_S, diurnal_workload, served_rate
from taskplane.bench.workloads import agent_workload
from taskplane.scheduler.flowcontrol.controller import FlowControl
from taskplane.scheduler.policies import build_policy
from taskplane.sim.elastic import FleetOptions, simulate_fleet
from taskplane.sim.workloads.base import Workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--day-s", type=float, default=3600.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--days", type=int, default=1, help="days back to back (a sleeper pays off when load comes back)")
    ap.add_argument("--levels", default="0,1,2")
    ap.add_argument("--sleep-max-s", default="600", help="comma-separated keep-asleep budgets to compare")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    def factory() -> FlowControl:
        return build_policy("taskplane", seed=a.seed, metrics=False)

    rate = served_rate(a.replicas, factory, a.seed)
    profile = profile_fleet(agent_workload(round(rate * PROBE_WINDOW_S), rate, a.seed), a.replicas, factory(),
                            window_s=PROBE_WINDOW_S, seed=a.seed)
    curve = DayCurve(day_s=a.day_s)
    wl = diurnal_workload(rate, curve, a.seed, None)
    days = [wl] + [diurnal_workload(rate, curve, a.seed + 10 * d, None) for d in range(1, a.days)]
    tasks = [replace(t, task_id=f"d{d}-{t.task_id}", session_id=f"d{d}-{t.session_id or t.task_id}",
                     arrival_s=t.arrival_s + d * a.day_s) for d, day in enumerate(days) for t in day.tasks]
    wl = Workload(name=f"diurnal-x{a.days}", tasks=tasks, block_size=wl.block_size)
    horizon = a.days * a.day_s
    model = wl.tasks[0].model
    rows = {}
    runs = [(0, 600.0)] if "0" in a.levels.split(",") else []
    runs += [(int(lv), float(keep)) for lv in a.levels.split(",") if lv != "0" for keep in a.sleep_max_s.split(",")]
    for level, keep in runs:
        gens = default_generations(f"h100:{2 * a.replicas}", model, profile["capacity_per_s"])
        pool = FleetOptions(generations=gens, min_replicas=1, max_replicas=2 * a.replicas, initial=1,
                            horizon_s=horizon, sleep_level=level)
        res = simulate_fleet(wl, factory(), TaskplaneAutoscaler(PlannerConfig(sleep_max_s=keep)), pool, seed=a.seed,
                             model=model)
        m = autoscaler_metrics(res, 1.0)
        name = "sleep_level=0" if level == 0 else f"sleep_level={level} sleep_max_s={keep:g}"
        rows[name] = {**m, "sleeps": res.stats.sleeps, "wakes": res.stats.wakes}
    print(f"{a.days} diurnal day(s) of {a.day_s:.0f} s, {len(wl.tasks)} tasks, served rate {rate:.3f}/s, up to {2 * a.replicas} H100s")
    cols = ("gpu_hours", "idle_gpu_hours", "cold_starts", "wakes", "sleeps", "deadline_met_ratio",
            "goodput_per_gpu_hour", "fleet_cost_per_successful_task_usd", "ttft_p99_ms", "failed_inflight_calls")
    print("| run | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for name, m in rows.items():
        print(f"| {name} | " + " | ".join(str(m[c]) for c in cols) + " |")
    base = rows.get("sleep_level=0")
    if base:
        for name, m in rows.items():
            if name != "sleep_level=0" and base["gpu_hours"] and base["goodput_per_gpu_hour"]:
                print(f"{name} vs 0: GPU-hours x{m['gpu_hours'] / base['gpu_hours']:.3f}, goodput/GPU-h "
                      f"x{(m['goodput_per_gpu_hour'] or math.nan) / base['goodput_per_gpu_hour']:.3f}, "
                      f"TTFT p99 x{(m['ttft_p99_ms'] or math.nan) / (base['ttft_p99_ms'] or math.nan):.3f}")
    if a.out:
        a.out.write_text(json.dumps({"rate": rate, "profile": profile, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
