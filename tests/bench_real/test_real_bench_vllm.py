"""A tiny real-engine bench: taskplane's gateway, a peer router (vllm-router
consistent_hash, when scripts/install-peers.sh has run) and client-side round-robin, each
in front of the same two real vLLM replicas, run the workload, and every figure the
bench reports is the replicas' own: prompt tokens queried equal what the client sent,
prefix hits equal the cached tokens vLLM reported call by call.

To stay short (about two minutes) the replicas are started once for all routers
(``fresh_replicas=False``); the bench itself restarts them before each router.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from taskplane.bench.options import BenchOptions
from taskplane.bench.real import run_real_bench
from taskplane.bench.real_routers import peers_python
from taskplane.engines.metrics import parse_metrics, relevant_lines

pytestmark = pytest.mark.vllm


def test_tiny_run_reports_the_replicas_own_counters(tmp_path: Path) -> None:
    routers = ["taskplane", "round-robin"]
    if peers_python() is not None:
        routers.insert(1, "vllm-router-consistent-hash")
    options = BenchOptions(out=tmp_path, engine="vllm", replicas=2, policies=",".join(routers), seed=5, tasks=4,
                           time_scale=0.2)
    results = run_real_bench(options, num_blocks=96, fresh_replicas=False)

    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["workload"] == "agents-vllm" and saved["replicas"] == 2 and saved["seed"] == 5
    assert list(saved["policies"]) == routers
    assert 0 < saved["hit_ceiling"] < 1
    assert "| taskplane |" in (tmp_path / "results.md").read_text()

    for name in routers:
        m = results["policies"][name]
        tasks = [json.loads(line) for line in (tmp_path / f"calls-{name}.jsonl").read_text().splitlines()]
        calls = [c for t in tasks for c in t["calls"]]
        ok = [c for c in calls if c["ok"]]
        assert m["calls"] == len(calls) and m["calls_ok"] == len(ok) > 4, (name, m)
        # A call fails only by its task's deadline (the gateway refusing a budget it cannot
        # meet, or the agent giving up): with 15 s triage deadlines that depends on what else
        # runs on the shared cores, so how many is not asserted. Such a call reaches no replica.
        assert all(c["ok"] or "deadline" in c["error"] for c in calls), (name, [c["error"] for c in calls])
        assert all(t["completed"] or "deadline" in t["error"] for t in tasks), name
        # The replicas' counters saw exactly the prompts the client sent ...
        assert m["prefix_cache_queries"] == sum(c["prompt_tokens"] for c in ok), name
        # ... and their prefix hits are the cached tokens vLLM reported for those calls.
        assert m["prefix_cache_hits"] == sum(c["cached_tokens"] for c in ok), name
        assert m["prefix_cache_hits"] > 0, name  # later steps reuse earlier ones
        assert m["prefix_hit_ratio"] == pytest.approx(m["prefix_cache_hits"] / m["prefix_cache_queries"], abs=1e-4)
        assert 0 < m["ttft_p50_ms"] <= m["ttft_p99_ms"] < m["call_e2e_p99_ms"] + 1
        assert m["busy_cpu_s"] > 0 and m["inference_s"] > 0 and m["engine_steps"] >= m["calls_ok"]
        # Tasks within deadline are counted from the tasks' own records.
        for t in tasks:
            assert t["deadline_met"] == (t["completed"] and t["finished_s"] - t["arrival_s"] <= t["deadline_s"]), name
        met = sum(1 for t in tasks if t["deadline_met"])
        completed = sum(1 for t in tasks if t["completed"])
        assert m["tasks"] == len(tasks) == 4 and m["tasks_succeeded"] == met, name
        assert m["deadline_met_ratio"] == met / 4 and m["tasks_late"] == completed - met, name
    # taskplane's gateway reports its own TTFT and the scheduler's decision time (its /metrics).
    tp_figures = results["policies"]["taskplane"]
    assert tp_figures["gateway_ttft_mean_ms"] > 0 and tp_figures["decision_mean_us"] > 0
    # The gateway's fast /metrics parse reads real vLLM pages to the same values as a full parse.
    pages = sorted((tmp_path / "work").glob("*/metrics-replica-*.txt"))
    assert len(pages) == 2 * len(routers)
    for page in pages:
        text = page.read_text()
        kept = relevant_lines(text)
        assert len(kept) < len(text) / 5
        fast = parse_metrics(text)
        assert fast.prefix_cache_queries > 0 and fast.num_gpu_blocks == 96 and fast.block_size == 128
        full = {f"{s.name}{sorted(s.labels.items())}": s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}
        for fam in text_string_to_metric_families(kept):
            for s in fam.samples:
                assert full[f"{s.name}{sorted(s.labels.items())}"] == s.value
    # taskplane's gateway names the replica that served each call; a task stays on one
    # (96 blocks of 128 tokens hold two tasks' contexts per replica: with 48, two 3-4k-token
    # contexts on one replica left no room, and a session moved for it, as it should).
    tp = [json.loads(line) for line in (tmp_path / "calls-taskplane.jsonl").read_text().splitlines()]
    for task in tp:
        served = {c["replica"] for c in task["calls"] if c["ok"]}  # a refused call has none
        assert len(served) == min(1, sum(c["ok"] for c in task["calls"])) and served <= {"replica-0", "replica-1"}, task["task_id"]
