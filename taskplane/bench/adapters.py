"""``taskplane bench --workload adapters``: tenants each with their own LoRA adapter on one
fleet of simulated replicas with LoRA enabled, placement policies side by side.

Every replica registers every adapter at start (as ``--lora-modules`` would) and holds at
most ``max_loras`` of them in GPU slots and ``max_cpu_loras`` in host memory. Adapter
popularity is Zipf; each task is an agent session of the agent workload whose calls all
run with its tenant's adapter, and a tenant's system prompt is its own (so, as in vLLM,
no two adapters share KV blocks). A cold load is an adapter's weights read from disk or
copied into a GPU slot: the engines' own counters.
"""

from __future__ import annotations

import dataclasses
import random
import shlex
import sys
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from taskplane.bench.metrics import call_latencies, policy_metrics
from taskplane.bench.options import BenchOptions, parse_policies
from taskplane.bench.render import rich_table, write_results
from taskplane.bench.runner import run_policy
from taskplane.bench.suite import build_cluster, preset_factories
from taskplane.bench.targets import evaluate
from taskplane.bench.workloads import agent_workload
from taskplane.errors import UserError
from taskplane.sim.cluster import ClusterResult, ClusterSpec
from taskplane.sim.lora import LoraSettings
from taskplane.sim.workloads.base import Workload

WORKLOAD = "adapters"
#: the policies compared by default: ours, llm-d with its LoRA affinity, AIBrix's adapter binding,
#: the classic default
DEFAULT_POLICIES = "taskplane,llm-d-lora,aibrix-lora,round-robin"
COLUMNS = (
    ("adapter_cold_loads", "adapter\ncold loads", "{:.0f}"),
    ("adapter_disk_loads", "disk\nloads", "{:.0f}"),
    ("adapter_preloads", "pre-\nloads", "{:.0f}"),
    ("adapter_unloads", "un-\nloads", "{:.0f}"),
    ("ttft_p50_ms", "TTFT\np50 ms", "{:.0f}"),
    ("ttft_p99_ms", "TTFT\np99 ms", "{:.0f}"),
    ("cost_per_successful_task_usd", "$ per\nok task", "{:.5f}"),
    ("deadline_met_ratio", "tasks in\ndeadline", "{:.0%}"),
)


@dataclass(frozen=True, kw_only=True)
class AdapterWorkload:
    """The adapters workload's shape (the defaults are the bench's)."""

    adapters: int = 24
    zipf_s: float = 1.0  # adapter k (from 1) is drawn with weight 1 / k**zipf_s
    max_loras: int = 4
    max_cpu_loras: int = 8
    tasks: int = 300
    tasks_per_s_per_replica: float = 0.06  # arrival rate, per replica of the fleet

    def adapter_names(self) -> list[str]:
        return [f"lora-{k:02d}" for k in range(self.adapters)]


def adapter_cluster(cluster: ClusterSpec, shape: AdapterWorkload) -> ClusterSpec:
    """``cluster`` with LoRA enabled on every replica and every adapter registered."""
    lora = LoraSettings(max_loras=shape.max_loras, max_cpu_loras=shape.max_cpu_loras)
    names = tuple(shape.adapter_names())
    replicas = [dataclasses.replace(r, lora=lora, adapters=names) for r in cluster.replicas]
    return dataclasses.replace(cluster, replicas=replicas)


def adapter_tasks(shape: AdapterWorkload, replicas: int, seed: int) -> Workload:
    """Agent sessions, each of one tenant, whose calls all carry that tenant's adapter."""
    base = agent_workload(shape.tasks, shape.tasks_per_s_per_replica * replicas, seed)
    rng = random.Random(seed * 7919 + 17)
    names = shape.adapter_names()
    weights = [1.0 / (k + 1) ** shape.zipf_s for k in range(len(names))]
    tasks = []
    for t in base.tasks:
        k = rng.choices(range(len(names)), weights)[0]
        # the tenant's own system prompt: its adapter's blocks are its own
        tasks.append(dataclasses.replace(t, tenant=f"tenant-{k:02d}", adapter=names[k],
                                         prefix_key=t.prefix_key * 1_000 + k + 1))
    return Workload(name=WORKLOAD, tasks=tasks, block_size=base.block_size,
                    meta={**base.meta, "adapters": shape.adapters, "zipf_s": shape.zipf_s})


def lora_figures(result: ClusterResult) -> dict[str, int]:
    disk = sum(r.lora_disk_loads for r in result.replicas)
    gpu = sum(r.lora_gpu_loads for r in result.replicas)
    pre = sum(r.lora_preloads for r in result.replicas)
    unloads = sum(r.lora_unloads for r in result.replicas)
    return {"adapter_cold_loads": disk + gpu, "adapter_disk_loads": disk, "adapter_gpu_loads": gpu,
            "adapter_preloads": pre, "adapter_unloads": unloads}


def run_adapters(options: BenchOptions, shape: AdapterWorkload | None = None) -> dict[str, Any]:
    """Run every policy on one adapters workload; print the table and the targets, write results."""
    if options.engine != "sim":
        raise UserError("--workload adapters runs in the cluster simulator: use --engine sim")
    shape = shape or AdapterWorkload(tasks=options.tasks or AdapterWorkload.tasks)
    if shape.tasks < 1:
        raise UserError("--tasks must be at least 1")
    cluster, fleet_spec = build_cluster(options.replicas, options.fleet, hints=options.hints)
    cluster = adapter_cluster(cluster, shape)
    workload = adapter_tasks(shape, len(cluster.replicas), options.seed)
    names = parse_policies(options.policies or DEFAULT_POLICIES)
    policies: dict[str, dict[str, Any]] = {}
    for name, make in preset_factories(names, options.seed).items():
        run = run_policy(make(), workload, cluster, seed=options.seed)
        m = policy_metrics(run.result, hit_ceiling=0.0, latencies=call_latencies(run.result),
                           decision_ns=run.decision_ns, wall_s=round(run.wall_s, 2))
        policies[name] = {**m, **lora_figures(run.result)}
    results: dict[str, Any] = {
        "workload": WORKLOAD, "fleet": fleet_spec, "seed": options.seed, "tasks": len(workload.tasks),
        "calls": workload.num_calls, "shape": dataclasses.asdict(shape), "policies": policies,
        "targets": evaluate(WORKLOAD, policies),
        "command": "taskplane " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else "",
    }
    write_results(options.out, results, page=_page)
    console = Console()
    console.print(rich_table(f"adapters on {fleet_spec} ({shape.adapters} adapters, max_loras {shape.max_loras})",
                             policies, COLUMNS))
    for t in results["targets"]:
        mark = "[green]met[/]" if t["met"] else "[red]not met[/]"
        console.print(f"target: {t['target']}: ratio {t['ratio']} ({mark})")
    console.print(f"wrote {options.out / 'results.json'}")
    return results


def _page(results: dict[str, Any]) -> str:
    """results.md: the table and the targets."""
    lines = [f"# adapters on {results['fleet']} (seed {results['seed']})", "",
             "| policy | " + " | ".join(h.replace("\n", " ") for _, h, _ in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]
    for name, m in results["policies"].items():
        lines.append(f"| {name} | " + " | ".join(str(m.get(k)) for k, _, _ in COLUMNS) + " |")
    lines += ["", *(f"- {t['target']}: ratio {t['ratio']} ({'met' if t['met'] else 'not met'})"
                    for t in results["targets"])]
    return "\n".join(lines) + "\n"
