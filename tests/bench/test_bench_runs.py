"""The benchmark itself: every policy completes a tiny run, a degenerate policy looks as bad
as it is, results are deterministic for a seed, and the command writes what it promises."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from taskplane.bench.ceiling import hit_ceiling
from taskplane.bench.command import run_bench
from taskplane.bench.metrics import WALL_CLOCK_FIELDS
from taskplane.bench.options import BenchOptions
from taskplane.bench.suite import Point, preset_factories, run_point, run_suite
from taskplane.bench.workloads import agent_tenants, agent_workload
from taskplane.errors import UserError
from taskplane.scheduler.policies import policy_names
from taskplane.scheduler.types import Action, CallRequest, Decision, ReplicaView
from taskplane.sim.cluster import ClusterSpec, ReplicaSpec

REQUIRED = ("ttft_p50_ms", "ttft_p99_ms", "prefix_hit_ratio", "deadline_met_ratio",
            "cost_per_successful_task_usd", "decision_p99_us")


def _tiny_trace(path: Path) -> Path:
    """Thirty requests in the Mooncake format: three conversations over a shared system block."""
    lines = []
    for i in range(30):
        conv = i % 3
        turn = i // 3
        ids = [0] + [100 * conv + k + 1 for k in range(2 + turn)]
        lines.append(json.dumps({"timestamp": i * 700, "input_length": len(ids) * 512 - 100,
                                 "output_length": 40, "hash_ids": ids}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_tiny_run_of_every_policy_completes(tmp_path: Path) -> None:
    cluster = ClusterSpec.fleet("h100:2,l40s:1")
    factories = preset_factories(policy_names(), seed=3, tenants=agent_tenants())
    options = BenchOptions(out=tmp_path, workload="agents", seed=3, tasks=6, load="0.5,1.3")
    results, _ = run_suite(options, cluster, "h100:2,l40s:1", factories, capacity_per_s=0.2)
    assert set(results["policies"]) == set(policy_names())
    assert [p["load"] for p in results["sweep"]] == [0.5, 1.3]
    for name, m in results["policies"].items():
        for key in REQUIRED:
            assert key in m, (name, key)
        assert m["calls_ok"] > 0 and m["tasks"] == 6, name
        assert m["decisions"] >= m["calls"], name
        assert 0.0 <= m["prefix_hit_ratio"] <= results["hit_ceiling"] + 1e-4, name  # both rounded
    assert {t["metric"] for t in results["targets"]} == {"deadline_met_ratio", "cost_per_successful_task_usd"}

    trace = _tiny_trace(tmp_path / "trace.jsonl")
    options = BenchOptions(out=tmp_path, workload="mooncake", seed=3, trace=trace)
    results, _ = run_suite(options, ClusterSpec.fleet("h100:2"), "h100:2", preset_factories(policy_names(), seed=3))
    assert results["workload_info"]["requests"] == 30
    assert all(m["calls_ok"] == 30 for m in results["policies"].values())
    assert {t["metric"] for t in results["targets"]} == {"hit_ceiling_ratio", "ttft_p50_ms", "ttft_p99_ms"}


def _everything_on_one_replica(req: CallRequest, replicas: list[ReplicaView]) -> Decision:
    first = next(r for r in replicas if r.healthy)
    return Decision(Action.PLACE, replica=first.name, model=first.model)


def test_one_replica_policy_is_worse_than_round_robin_on_a_balanced_load() -> None:
    # four replicas whose KV caches (400 blocks of 256 tokens each) together hold the
    # sessions in flight, one alone does not; deadlines out of the way
    wl = agent_workload(40, 0.5, seed=2, deadline_scale=100.0)
    point = Point(load=None, workload=wl, ceiling=hit_ceiling(wl))
    factories = {"round-robin": preset_factories(["round-robin"], seed=2)["round-robin"],
                 "one-replica": lambda: _everything_on_one_replica}
    cluster = ClusterSpec([ReplicaSpec(f"r{i}", gpu="h100", kv_blocks=400) for i in range(4)])
    run_point(point, cluster, factories, seed=2)
    rr, one = point.policies["round-robin"], point.policies["one-replica"]
    assert one["hit_ceiling_ratio"] < rr["hit_ceiling_ratio"]
    assert one["ttft_p50_ms"] > rr["ttft_p50_ms"]
    assert one["ttft_p99_ms"] > rr["ttft_p99_ms"]


def _numbers(doc: Any) -> Any:
    """results.json minus what the wall clock decides."""
    if isinstance(doc, dict):
        return {k: _numbers(v) for k, v in doc.items()
                if k not in WALL_CLOCK_FIELDS and k not in ("generated_at", "command")}
    if isinstance(doc, list):
        return [_numbers(v) for v in doc]
    return doc


def test_same_seed_same_results_json(tmp_path: Path) -> None:
    trace = _tiny_trace(tmp_path / "trace.jsonl")
    args = dict(workload="mooncake", trace=trace, replicas=3, policies="round-robin,llm-d-scorers,taskplane",
                seed=7, time_scale=0.5)
    run_bench(BenchOptions(out=tmp_path / "a", **args))  # type: ignore[arg-type]
    run_bench(BenchOptions(out=tmp_path / "b", **args))  # type: ignore[arg-type]
    a = json.loads((tmp_path / "a" / "results.json").read_text())
    b = json.loads((tmp_path / "b" / "results.json").read_text())
    assert _numbers(a) == _numbers(b)
    assert a["policies"]["taskplane"]["decision_p99_us"] > 0
    for name in ("results.md", "ttft_cdf.png", "hit_ratio.png"):
        assert (tmp_path / "a" / name).stat().st_size > 0
    assert (tmp_path / "a" / "ttft_cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "a" / "results.md").read_text()
    assert "| taskplane |" in md and "| round-robin |" in md


def test_agents_command_writes_the_sweep_and_its_plot(tmp_path: Path) -> None:
    # a capacity measured before is reused from capacity.json (here: planted, to keep it quick)
    out = tmp_path / "agents"
    out.mkdir()
    from taskplane.bench.suite import _capacity_key

    (out / "capacity.json").write_text(json.dumps({
        "key": _capacity_key("h100:2", 5, 60.0, None),
        "capacity": {"tasks_per_s": 0.1, "reference_policy": "llm-d-scorers", "window_s": 60.0,
                     "slo_attainment": 0.9, "probes": []}}))
    res = run_bench(BenchOptions(out=out, workload="agents", replicas=2, policies="session-hash,taskplane", seed=5,
                                 load="0.5,1.3", duration_s=60.0))
    assert res["capacity"]["tasks_per_s"] == 0.1
    assert [p["load"] for p in res["sweep"]] == [0.5, 1.3]
    assert [p["tasks"] for p in res["sweep"]] == [10, 10]  # at least ten tasks per point
    assert (out / "deadline_vs_load.png").stat().st_size > 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["workload"] == "agents" and doc["replicas"] == 2 and doc["seed"] == 5
    assert set(doc["policies"]) == {"session-hash", "taskplane"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"engine": "vllm", "workload": "mooncake"}, "agents workload"),
        ({"engine": "vllm", "replicas": 16}, "--replicas 2"),
        ({"engine": "tpu"}, "--engine must be sim or vllm"),
        ({"workload": "nope"}, "--workload"),
        ({"policies": "round-robin,bogus"}, "unknown policy bogus"),
        ({"fleet": "h100:2,tpu:4"}, "--fleet"),
        ({"workload": "mooncake", "trace": Path("/nonexistent.jsonl")}, "no such file"),
        ({"load": "0.5,x"}, "--load"),
    ],
)
def test_user_errors(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        run_bench(BenchOptions(out=tmp_path, **kwargs))
