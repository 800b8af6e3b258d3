"""`taskplane bench --workload scale`: the fleet-scale run, in one cell and split into cells
run by separate processes; what it writes and the figures it derives."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from taskplane.bench.command import run_bench
from taskplane.bench.options import BenchOptions
from taskplane.bench.scale import ScaleRun, cell_of, simulate_cell
from taskplane.bench.workloads import agent_workload
from taskplane.errors import UserError

SMALL = ScaleRun(replicas=12, tasks=60, rate=1.8, policy="taskplane", gpu="h100", seed=3)


def test_cells_partition_tasks_and_replicas_exactly() -> None:
    wl = agent_workload(SMALL.tasks, SMALL.arrival_rate, SMALL.seed)
    thirds = dataclasses.replace(SMALL, cells=3)
    runs = [simulate_cell(thirds, cell=c) for c in range(3)]
    assert [r.replicas for r in runs] == [4, 4, 4]
    assert sum(r.tasks for r in runs) == len(wl.tasks)
    assert all(r.tasks > 0 for r in runs)  # the hash spreads 60 tasks over 3 cells
    for c, r in enumerate(runs):
        assert r.tasks == sum(1 for t in wl.tasks if cell_of(t.task_id, 3) == c)
    assert sum(r.calls for r in runs) == wl.num_calls  # every call of every task ran, in its task's cell
    assert sum(r.decision_ns.size for r in runs) >= wl.num_calls


def test_one_cell_is_the_whole_fleet_and_deterministic() -> None:
    a = simulate_cell(SMALL)
    b = simulate_cell(SMALL)
    assert a.replicas == 12 and a.tasks == 60
    assert (a.calls, a.calls_ok, a.cached_tokens, a.virtual_s) == (b.calls, b.calls_ok, b.cached_tokens, b.virtual_s)
    assert a.cached_tokens > 0 and a.kv_index["replica_block_entries"] > 0


def test_bench_scale_in_two_processes_writes_its_figures(tmp_path: Path) -> None:
    r = run_bench(BenchOptions(out=tmp_path, workload="scale", replicas=12, tasks=60, seed=3, cells=2))
    doc = json.loads((tmp_path / "scale.json").read_text())
    assert doc == json.loads(json.dumps(r))
    assert doc["cells"] == 2 and doc["replicas_per_cell"] == [6, 6]
    assert doc["calls"] == agent_workload(60, 0.15 * 12, 3).num_calls
    assert doc["outcome"]["calls_ok"] >= doc["calls"] * 0.9
    assert doc["decision"]["count"] >= doc["calls"]
    assert doc["timing"]["cpu_s"] > 0 and len(doc["timing"]["cell_simulate_wall_s"]) == 2
    md = (tmp_path / "scale.md").read_text()
    assert "| cells (one scheduler and process each) | 2 (6, 6 replicas) |" in md


@pytest.mark.parametrize(("kw", "message"), [
    ({"cells": 13}, "--cells must be between 1 and --replicas (12)"),
    ({"policies": "taskplane,round-robin"}, "one policy"),
    ({"engine": "vllm"}, "--engine sim"),
])
def test_bad_scale_options_are_one_clear_error(tmp_path: Path, kw: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_bench(BenchOptions(out=tmp_path, **{"workload": "scale", "replicas": 12, "tasks": 10, **kw}))  # type: ignore[arg-type]
    assert not (tmp_path / "scale.json").exists()


def test_cells_are_refused_outside_the_scale_workload(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--workload scale only"):
        run_bench(BenchOptions(out=tmp_path, workload="agents", replicas=4, tasks=5, cells=2))


def test_cli_runs_the_scale_workload(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "taskplane.cli", "bench", "--workload", "scale", "--replicas", "8",
                          "--tasks", "20", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "| replicas / tasks / calls | 8 / 20 /" in res.stdout
    assert json.loads((tmp_path / "scale.json").read_text())["cells"] == 1
