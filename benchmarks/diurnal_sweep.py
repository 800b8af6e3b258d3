"""taskplane's planner with other PlannerConfig settings on the diurnal bench, beside baselines.

    python -m benchmarks.diurnal_sweep --out OUT [--replicas 4] [--seed 1] [--trace T] [--cold-start-s S] VARIANT...

VARIANT: an autoscaler's name (``aibrix-kpa``, ``taskplane``: as the bench builds it, the
baselines tuned from the fleet profile), a JSON object of PlannerConfig fields
(``'{"target_load": 2.0}'``; the extra key ``freeze_profiles_s`` keeps the agents' learned
profiles as they stood at that virtual second, an experiment: does the planner's demand
shrink as queueing lengthens the seconds per step?), or ``probe:RATE``: the fixed fleet at a constant RATE
(tasks/s, the served-rate probe's measurement) and the clairvoyant fleet's GPU-hours if
replicas ran at that per-replica rate (where the SLO's slack ends). The served rate and the fleet profile are probed once and
cached in OUT/profile.json (the same steps as ``taskplane bench --workload diurnal``);
each variant's figures are appended to OUT/sweep.jsonl, so several invocations can run side
by side and the baselines run once.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from taskplane.autoscale.planner import PlannerConfig, TaskplaneAutoscaler
from taskplane.autoscale.registry import Autoscaler
from taskplane.autoscale.types import Plan, PoolSignals
from taskplane.bench.diurnal import (
    DayCurve,
    FleetBounds,
    autoscaler_metrics,
    default_generations,
    profile_fleet,
    run_autoscalers,
    tuned_baselines,
)
from taskplane.bench.diurnal_command import PROBE_WINDOW_S, diurnal_workload, served_rate
from taskplane.bench.workloads import agent_workload
from taskplane.scheduler.policies import build_policy
from taskplane.sim.cluster import ClusterSpec, simulate

FIELDS = ("gpu_hours", "goodput_per_gpu_hour", "deadline_met_ratio", "failed_inflight_calls",
          "reprefill_tokens_after_scale_in", "cold_starts", "peak_replicas")


class FrozenProfiles(TaskplaneAutoscaler):
    """taskplane's planner reading the agents' profiles as they were at ``freeze_s``."""

    def __init__(self, config: PlannerConfig, freeze_s: float) -> None:
        super().__init__(config)
        self.freeze_s = freeze_s
        self._frozen: PoolSignals | None = None

    def plan(self, s: PoolSignals) -> Plan:
        if s.now_s <= self.freeze_s or self._frozen is None:
            self._frozen = s
        else:
            s = replace(s, profiles=self._frozen.profiles, default_profile=self._frozen.default_profile)
        return super().plan(s)


def fleet_profile(out: Path, replicas: int, seed: int, factory: Any) -> dict[str, Any]:
    """The served rate and the fleet's profile at it, probed once per OUT."""
    path = out / "profile.json"
    if path.exists():
        cached: dict[str, Any] = json.loads(path.read_text())
        return cached
    rate = served_rate(replicas, factory, seed)
    profile = profile_fleet(agent_workload(round(rate * PROBE_WINDOW_S), rate, seed), replicas, factory(),
                            window_s=PROBE_WINDOW_S, seed=seed)
    data = {"rate": rate, "profile": profile}
    path.write_text(json.dumps(data, indent=2))
    return data


def probe(a: argparse.Namespace, rate: float, served: float, curve: DayCurve, factory: Any) -> dict[str, Any]:
    """Deadline-met of the fixed fleet at ``rate`` (as served_rate probes it) and the GPU-hours
    of a clairvoyant fleet whose replicas each carry ``rate / replicas`` of the day's load."""
    wl = agent_workload(max(10, round(rate * PROBE_WINDOW_S)), rate, a.seed)
    res = simulate(ClusterSpec.fleet(f"h100:{a.replicas}"), wl, factory(), seed=a.seed)
    met = sum(1 for t in res.tasks if t.deadline_met) / max(len(res.tasks), 1)
    gpu_h = curve.clairvoyant_gpu_hours(a.replicas * served / rate)
    row = {"variant": f"probe:{rate}", "seed": a.seed, "rate": rate, "rate_vs_served": round(rate / served, 4),
           "deadline_met_ratio": round(met, 4), "clairvoyant_gpu_hours": round(gpu_h, 4)}
    with (a.out / "sweep.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--trace", type=Path, default=None)
    ap.add_argument("--cold-start-s", type=float, default=None, help="every replica's (default: the GPU's)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)

    def factory() -> Any:
        return build_policy("taskplane", seed=a.seed, metrics=False)

    data = fleet_profile(a.out, a.replicas, a.seed, factory)
    curve = DayCurve()
    wl = diurnal_workload(data["rate"], curve, a.seed, a.trace)
    gens = default_generations(f"h100:{2 * a.replicas}", wl.tasks[0].model, data["profile"]["capacity_per_s"],
                               cold_start_s=a.cold_start_s)
    tuned = tuned_baselines(data["profile"])
    for variant in a.variants:
        if variant.startswith("probe:"):
            print(json.dumps(probe(a, float(variant[6:]), data["rate"], curve, factory)), flush=True)
            continue
        if variant.startswith("{"):
            cfg: dict[str, Any] = json.loads(variant)
            fields = {k: v for k, v in cfg.items() if k != "freeze_profiles_s"}
            scaler: Autoscaler = (FrozenProfiles(PlannerConfig(**fields), cfg["freeze_profiles_s"])
                                  if "freeze_profiles_s" in cfg else TaskplaneAutoscaler(PlannerConfig(**fields)))
            name = "taskplane"
        else:
            scaler, name, cfg = tuned.get(variant) or TaskplaneAutoscaler(), variant, {}
        bounds = FleetBounds(generations=gens, min_replicas=1, max_replicas=2 * a.replicas,
                             fixed=math.ceil(a.replicas * curve.peak), horizon_s=curve.day_s, seed=a.seed)
        res = run_autoscalers(wl, [name], factory, bounds, tuned={name: scaler})
        m = autoscaler_metrics(res[name], 1.0)
        row = {"variant": variant, "autoscaler": name, "config": cfg, "trace": str(a.trace) if a.trace else None,
               "cold_start_s": gens[0].cold_start_s, "seed": a.seed, "tasks": len(wl.tasks), **{k: m[k] for k in FIELDS}}
        with (a.out / "sweep.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
