"""The adapters bench's fleet and sessions with variants of the taskplane preset's adapter
plugins, one run each: which decision moves cold loads and TTFT p99.

    .venv/bin/python benchmarks/adapters_variants.py SEED [VARIANT ...]
"""

from __future__ import annotations

import sys
from typing import Any

from taskplane.bench.adapters import AdapterWorkload, adapter_cluster, adapter_tasks, lora_figures
from taskplane.bench.metrics import call_latencies, policy_metrics
from taskplane.bench.runner import run_policy
from taskplane.bench.suite import build_cluster
from taskplane.scheduler.policies import build_scheduler
from taskplane.scheduler.presets import PRESETS


def _scorers(weights: dict[str, float] | None = None, **residency: Any) -> list[Any]:
    """The preset's scorers, ``weights`` by type name replaced, the residency params overridden."""
    out = []
    for s in PRESETS["taskplane"].scorers:
        if isinstance(s, dict) and s["type"] == "adapter-residency":
            s = {**s, "params": {**s["params"], **residency}}
        if isinstance(s, dict) and weights and s["type"] in weights:
            s = {**s, "weight": weights[s["type"]]}
        out.append(s)
    return out


VARIANTS: dict[str, dict[str, Any]] = {
    "preset": {},
    "holder-0.1": {"sessions_per_holder": 0.1},
    "holder-0.2": {"sessions_per_holder": 0.2},
    "holder-1": {"sessions_per_holder": 1.0},
    "no-preload": {"preload": False},
    "w4": {"weights": {"adapter-affinity": 4.0, "adapter-residency": 4.0}},
    "w8": {"weights": {"adapter-affinity": 8.0, "adapter-residency": 8.0}},
    "w8-holder-1": {"weights": {"adapter-affinity": 8.0, "adapter-residency": 8.0}, "sessions_per_holder": 1.0},
}


def main() -> None:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    names = sys.argv[2:] or list(VARIANTS)
    shape = AdapterWorkload()
    cluster, _ = build_cluster(8, None)
    cluster = adapter_cluster(cluster, shape)
    workload = adapter_tasks(shape, len(cluster.replicas), seed)
    for name in names:
        policy = build_scheduler(policy="taskplane", scorers=_scorers(**VARIANTS[name]), seed=seed, metrics=False)
        run = run_policy(policy, workload, cluster, seed=seed)
        m = policy_metrics(run.result, hit_ceiling=0.0, latencies=call_latencies(run.result),
                           decision_ns=run.decision_ns, wall_s=round(run.wall_s, 2))
        f = lora_figures(run.result)
        print(f"seed {seed} {name:12s} cold {f['adapter_cold_loads']:4d} (disk {f['adapter_disk_loads']}) "
              f"pre {f['adapter_preloads']:3d} ttft p50 {m['ttft_p50_ms']:.0f} p99 {m['ttft_p99_ms']:.0f} "
              f"$ {m['cost_per_successful_task_usd']:.5f}", flush=True)


if __name__ == "__main__":
    main()
