"""Sweep the agent-pd decider's params (taskplane-pd) on the agent mix, on one seed.

    python -m benchmarks.pd_tune SEED CAPACITY_TASKS_PER_S [P:D] [--window-s S] [--loads 1.0,1.3]

CAPACITY is the aggregated fleet's (``capacity_tasks_per_s`` in a ``bench --pd`` results.json).
Prints, per param set and load, the metrics ``bench --pd`` reports."""

from __future__ import annotations

import argparse

from taskplane.bench.pd import parse_pd, pd_fleet, pd_metrics
from taskplane.bench.workloads import agent_tenants, agent_workload, tasks_for
from taskplane.scheduler.policies import build_policy
from taskplane.sim.pd_cluster import simulate_pd

VARIANTS: dict[str, dict[str, object]] = {
    "default": {},
    "long768": {"long_prompt_tokens": 768},
    "long512-new128": {"long_prompt_tokens": 512, "min_new_tokens": 128},
    "long256-new64": {"long_prompt_tokens": 256, "min_new_tokens": 64},
    "long512-heavy3-r3": {"long_prompt_tokens": 512, "decode_heavy_running": 3, "max_remote_ratio": 3.0},
    "all-new64-r4": {"long_prompt_tokens": 64, "min_new_tokens": 64, "max_remote_ratio": 4.0},
    "heavy2": {"decode_heavy_running": 2},
    "heavy1-r4": {"decode_heavy_running": 1, "max_remote_ratio": 4.0},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("seed", type=int)
    ap.add_argument("capacity", type=float)
    ap.add_argument("pd", nargs="?", default="2:6")
    ap.add_argument("--window-s", type=float, default=None, help="arrivals over this window (bench --pd's default "
                    "1200) instead of 300 tasks (bench --pd --tasks 300)")
    ap.add_argument("--loads", default="1.0,1.3")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    seed, capacity, (n_p, n_d) = a.seed, a.capacity, parse_pd(a.pd)
    for load in (float(x) for x in a.loads.split(",")):
        rate = load * capacity
        wl = agent_workload(300 if a.window_s is None else tasks_for(rate, a.window_s), rate, seed)
        for name in a.variants.split(","):
            params = VARIANTS[name]
            cfg = {"policy": "taskplane-pd", "seed": seed,
                   "disaggregation": {"decider": {"type": "agent-pd", "params": params}}}
            res = simulate_pd(pd_fleet(n_p, n_d), wl, build_policy(cfg, tenants=agent_tenants()), seed=seed)
            print(f"{load}x {name:16s} {pd_metrics(res)}", flush=True)


if __name__ == "__main__":
    main()
