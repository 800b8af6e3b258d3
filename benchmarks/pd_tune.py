"""Sweep the agent-pd decider's params (taskplane-pd) on the agent mix, on one seed.

    python -m benchmarks.pd_tune SEED CAPACITY_TASKS_PER_S [P:D]

CAPACITY is the aggregated fleet's (``capacity_tasks_per_s`` in a ``bench --pd`` results.json).
Prints, per param set and load, the metrics ``bench --pd`` reports."""

from __future__ import annotations

import sys

from taskplane.bench.pd import parse_pd, pd_fleet, pd_metrics
from taskplane.bench.workloads import agent_tenants, agent_workload
from taskplane.scheduler.policies import build_policy
from taskplane.sim.pd_cluster import simulate_pd

VARIANTS: dict[str, dict[str, object]] = {
    "default": {},
    "long768": {"long_prompt_tokens": 768},
    "long512-new128": {"long_prompt_tokens": 512, "min_new_tokens": 128},
    "long256-new64": {"long_prompt_tokens": 256, "min_new_tokens": 64},
    "long512-heavy3-r3": {"long_prompt_tokens": 512, "decode_heavy_running": 3, "max_remote_ratio": 3.0},
    "all-new64-r4": {"long_prompt_tokens": 64, "min_new_tokens": 64, "max_remote_ratio": 4.0},
}


def main() -> None:
    seed, capacity = int(sys.argv[1]), float(sys.argv[2])
    n_p, n_d = parse_pd(sys.argv[3] if len(sys.argv) > 3 else "2:6")
    for load in (1.0, 1.3):
        rate = load * capacity
        wl = agent_workload(300, rate, seed)  # as bench --pd --tasks 300
        for name, params in VARIANTS.items():
            cfg = {"policy": "taskplane-pd", "seed": seed,
                   "disaggregation": {"decider": {"type": "agent-pd", "params": params}}}
            res = simulate_pd(pd_fleet(n_p, n_d), wl, build_policy(cfg, tenants=agent_tenants()), seed=seed)
            print(f"{load}x {name:16s} {pd_metrics(res)}", flush=True)


if __name__ == "__main__":
    main()
