"""``taskplane bench --workload models``: two base models sharing one fleet while demand shifts
between them, a fleet that swaps models beside static partitions of the same GPUs.

The agent workload's tasks are each given one of two base models; the share of the first
alternates between ``heavy_share`` and ``1 - heavy_share`` every phase of the arrival
window, so each model in turn needs most of the fleet. Two fleets of the same H100s:

- swapping: every replica hosts both models (vLLM sleep mode, one engine each; half start
  with each model awake), placed by ``taskplane``, which swaps a replica when that pays
  (:mod:`taskplane.sim.swap_cluster`, :mod:`taskplane.scheduler.swapcost`);
- static: half the replicas serve each model, one pool per model (llm-d's one
  InferencePool per model), placed by ``taskplane``, ``llm-d-scorers`` and ``round-robin``
  within each model's pool.

A model's system prompts are its own (different weights: no KV block is shared).
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
from taskplane.bench.workloads import agent_tenants, agent_workload
from taskplane.errors import UserError
from taskplane.sim.cluster import ClusterResult, ClusterSpec
from taskplane.sim.swap_cluster import simulate_models
from taskplane.sim.workloads.base import Workload
from taskplane.store.records import TaskStatus

WORKLOAD = "models"
#: (policy, fleet) runs by default: ours on the swapping fleet, then everyone on the static partition
DEFAULT_RUNS = "taskplane:swap,taskplane:static,llm-d-scorers:static,round-robin:static"
COLUMNS = (
    ("deadline_met_ratio", "tasks in\ndeadline", "{:.0%}"),
    ("ttft_p50_ms", "TTFT\np50 ms", "{:.0f}"),
    ("ttft_p99_ms", "TTFT\np99 ms", "{:.0f}"),
    ("cost_per_successful_task_usd", "$ per\nok task", "{:.5f}"),
    ("model_swaps", "swaps", "{:.0f}"),
    ("swap_s", "swap\ns", "{:.0f}"),
)


@dataclass(frozen=True, kw_only=True)
class ModelsWorkload:
    """The models workload's shape (the defaults are the bench's)."""

    models: tuple[str, ...] = ("llama-3.1-8b", "qwen-2.5-7b")  # (the second is modelled as an 8B)
    heavy_share: float = 0.9  # the busy model's share of arrivals in its phase
    phases: int = 2
    tasks: int = 600
    tasks_per_s_per_replica: float = 0.3  # heavy enough that one model's half of the fleet is overloaded


def models_tasks(shape: ModelsWorkload, replicas: int, seed: int) -> Workload:
    """Agent tasks whose model follows the phase of their arrival (first model heavy first)."""
    base = agent_workload(shape.tasks, shape.tasks_per_s_per_replica * replicas, seed)
    end = max((t.arrival_s for t in base.tasks), default=0.0) + 1e-9
    rng = random.Random(seed * 104729 + 11)
    a, b = shape.models[0], shape.models[1]
    tasks = []
    for t in base.tasks:
        phase = int(t.arrival_s / end * shape.phases)
        share_a = shape.heavy_share if phase % 2 == 0 else 1.0 - shape.heavy_share
        k = 0 if rng.random() < share_a else 1
        tasks.append(dataclasses.replace(t, model=(a, b)[k], prefix_key=t.prefix_key * 1_000 + k + 1))
    return Workload(name=WORKLOAD, tasks=tasks, block_size=base.block_size,
                    meta={**base.meta, "models": list(shape.models), "heavy_share": shape.heavy_share,
                          "phases": shape.phases})


def models_fleet(cluster: ClusterSpec, shape: ModelsWorkload, *, swap: bool) -> ClusterSpec:
    """``cluster``'s GPUs, half starting on each model: hosting both (swap) or one each (static)."""
    a, b = shape.models[0], shape.models[1]
    half = len(cluster.replicas) // 2
    reps = []
    for k, r in enumerate(cluster.replicas):
        awake = a if k < max(half, 1) else b
        reps.append(dataclasses.replace(r, model=awake, models=tuple(shape.models) if swap else ()))
    return dataclasses.replace(cluster, replicas=reps)


def model_figures(result: ClusterResult, models: tuple[str, ...]) -> dict[str, Any]:
    """Swaps and the seconds they took, and each model's tasks done of its tasks."""
    out: dict[str, Any] = {"model_swaps": sum(r.model_swaps for r in result.replicas),
                           "swap_s": round(sum(r.swap_s for r in result.replicas), 1)}
    model_of = {c.task_id: c.model_requested for c in result.calls}
    for m in models:
        mine = [t for t in result.tasks if model_of.get(t.task_id) == m]
        ok = sum(1 for t in mine if t.status == TaskStatus.SUCCEEDED)
        out[f"tasks_ok_{m}"] = f"{ok}/{len(mine)}"
    return out


def parse_runs(text: str) -> list[tuple[str, str]]:
    """``"taskplane:swap,round-robin:static"`` -> [(policy, fleet)]; a bare name runs on both fleets."""
    runs: list[tuple[str, str]] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, fleet = part.partition(":")
        parse_policies(name)  # a known preset
        for f in (fleet,) if fleet else ("swap", "static"):
            if f not in ("swap", "static"):
                raise UserError(f"--policies {part!r}: the fleet after ':' is swap or static")
            runs.append((name, f))
    return runs


def run_models(options: BenchOptions, shape: ModelsWorkload | None = None) -> dict[str, Any]:
    """Every (policy, fleet) run on one models workload; print the table, write results."""
    if options.engine != "sim":
        raise UserError("--workload models runs in the cluster simulator: use --engine sim")
    shape = shape or ModelsWorkload(tasks=options.tasks or ModelsWorkload.tasks)
    cluster, fleet_spec = build_cluster(options.replicas, options.fleet, hints=options.hints)
    if len(cluster.replicas) < 2 or shape.tasks < 1:
        raise UserError("--workload models needs at least 2 replicas and 1 task")
    workload = models_tasks(shape, len(cluster.replicas), options.seed)
    runs = parse_runs(options.policies or DEFAULT_RUNS)
    factories = preset_factories(sorted({n for n, _ in runs}), options.seed, agent_tenants())
    policies: dict[str, dict[str, Any]] = {}
    for name, fleet in runs:
        spec = models_fleet(cluster, shape, swap=fleet == "swap")
        run = run_policy(factories[name](), workload, spec, seed=options.seed, simulator=simulate_models)
        m = policy_metrics(run.result, hit_ceiling=0.0, latencies=call_latencies(run.result),
                           decision_ns=run.decision_ns, wall_s=round(run.wall_s, 2))
        policies[f"{name} ({fleet})"] = {**m, **model_figures(run.result, shape.models)}
    results: dict[str, Any] = {
        "workload": WORKLOAD, "fleet": fleet_spec, "seed": options.seed, "tasks": len(workload.tasks),
        "calls": workload.num_calls, "shape": dataclasses.asdict(shape), "policies": policies,
        "command": "taskplane " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else "",
    }
    write_results(options.out, results, page=_page)
    console = Console()
    console.print(rich_table(f"models on {fleet_spec}: {' / '.join(shape.models)}, demand shifting", policies,
                             COLUMNS))
    console.print(f"wrote {options.out / 'results.json'}")
    return results


def _page(results: dict[str, Any]) -> str:
    """results.md: the table."""
    keys = [k for k, _, _ in COLUMNS] + [f"tasks_ok_{m}" for m in results["shape"]["models"]]
    lines = [f"# models on {results['fleet']} (seed {results['seed']})", "",
             "| policy (fleet) | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name, m in results["policies"].items():
        lines.append(f"| {name} | " + " | ".join(str(m.get(k)) for k in keys) + " |")
    return "\n".join(lines) + "\n"
