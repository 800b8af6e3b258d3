"""``--workload adapters``: a small run whose outcomes are the point (placement by adapter
saves loads), and the simulated fleet's LoRA view is what a live scrape would give."""

from __future__ import annotations

import json
from pathlib import Path

from taskplane.bench.adapters import AdapterWorkload, adapter_cluster, adapter_tasks, run_adapters
from taskplane.bench.options import BenchOptions
from taskplane.sim.cluster import ClusterSpec
from taskplane.sim.replicas import SimReplicas
from taskplane.store.records import Outcome


def test_taskplane_loads_adapters_less_often_than_round_robin(tmp_path: Path) -> None:
    options = BenchOptions(out=tmp_path, workload="adapters", replicas=4, seed=3,
                           policies="taskplane,llm-d-lora,aibrix-lora,round-robin")
    results = run_adapters(options, AdapterWorkload(adapters=12, tasks=40))
    p = results["policies"]
    assert set(p) == {"taskplane", "llm-d-lora", "aibrix-lora", "round-robin"}
    assert all(m["tasks_succeeded"] == 40 for m in p.values())
    assert p["taskplane"]["adapter_cold_loads"] < p["round-robin"]["adapter_cold_loads"]
    assert p["llm-d-lora"]["adapter_cold_loads"] < p["round-robin"]["adapter_cold_loads"]
    # only the planners (taskplane's demand plan, AIBrix's bindings) read adapters ahead of demand; the baselines load on the request path
    assert p["taskplane"]["adapter_preloads"] > 0
    assert p["llm-d-lora"]["adapter_preloads"] == p["round-robin"]["adapter_preloads"] == 0
    # AIBrix's controller loads each adapter once where it binds it (12 adapters, one pod each)
    assert p["aibrix-lora"]["adapter_preloads"] == 12
    assert p["aibrix-lora"]["adapter_disk_loads"] == 0
    assert {t["metric"] for t in results["targets"]} == {
        "adapter_cold_loads", "ttft_p99_ms", "cost_per_successful_task_usd"}
    assert json.loads((tmp_path / "results.json").read_text())["workload"] == "adapters"


def test_every_task_carries_its_tenants_adapter_and_the_fleet_registers_them_all() -> None:
    shape = AdapterWorkload(adapters=6, tasks=30)
    workload = adapter_tasks(shape, replicas=2, seed=1)
    assert all(t.adapter == "lora-" + t.tenant.removeprefix("tenant-") for t in workload.tasks)
    popular = sum(t.adapter == "lora-00" for t in workload.tasks)
    assert popular > sum(t.adapter == "lora-05" for t in workload.tasks)  # Zipf
    fleet = SimReplicas(adapter_cluster(ClusterSpec.fleet("h100:2"), shape), 16, kv_events=False, table=False)
    assert all(e.adapters is not None and len(e.adapters.registered) == 6 for e in fleet.engines)
    assert all(v.max_loras == 4 and not v.lora_running for v in fleet.views)


def test_unloads_by_demand_leave_every_call_completed() -> None:
    """Two GPU slots for twelve adapters: the planner unloads where slots run short, and
    every task still ends well (a call never lands where its adapter was unloaded)."""
    from taskplane.bench.runner import run_policy
    from taskplane.scheduler.policies import build_policy
    from taskplane.scheduler.presets import PRESETS

    shape = AdapterWorkload(adapters=12, tasks=60, max_loras=2, max_cpu_loras=4, tasks_per_s_per_replica=0.2)
    scorers = [dict(s, params={**s["params"], "unload": True, "max_unloads": 8})
               if s["type"] == "adapter-residency" else s for s in PRESETS["taskplane"].scorers]
    policy = build_policy({"policy": "taskplane", "scorers": scorers}, seed=1, metrics=False)
    cluster = adapter_cluster(ClusterSpec.fleet("h100:4"), shape)
    result = run_policy(policy, adapter_tasks(shape, 4, seed=1), cluster, seed=1).result
    assert sum(r.lora_unloads for r in result.replicas) > 0
    summary = result.summary()
    assert summary["tasks"] == summary["tasks_succeeded"] == 60
    done = {(c.task_id, c.step) for c in result.calls if c.outcome == Outcome.SUCCESS}
    assert done == {(c.task_id, c.step) for c in result.calls}  # every call completed, on some attempt
