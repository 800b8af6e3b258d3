"""The live agent-sessions bench, tiny, end to end on real parts: simulated replicas over
HTTP and ZMQ, the real gateway (Envoy + taskplane's endpoint picker), the real client.

Asserts the outcome's shape and accounting, not timing: every task of every target
completes, a fleet with room refuses nothing, each target sent the same calls, and the
replicas' own counters account for every call the client saw answered.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

from rich.console import Console

from taskplane.bench.agent_sessions import TARGETS, SessionsOptions, bench, render_table
from taskplane.dev import processes as proc
from taskplane.procfs import group_members


def test_agent_sessions_every_target_serves_every_task_without_refusal(tmp_path: Path) -> None:
    calls_out = tmp_path / "calls.jsonl"
    options = SessionsOptions(sessions=6, replicas=3, rounds=1, speed=10.0, kv_blocks=4096)
    res = bench(options, calls_out=calls_out, console=Console(file=io.StringIO()))

    (run,) = res["runs"]
    assert set(run) == set(TARGETS)
    calls = {fig["calls"] for fig in run.values()}
    assert calls == {res["calls_per_run"]}  # the same workload went to every target
    for name, fig in run.items():
        assert fig["tasks"] == res["sessions"] == 6, name
        assert fig["tasks_completed"] == 6, (name, fig["call_errors"])
        assert fig["calls_ok"] == fig["calls"], name
        assert fig["refusals"] == 0, name  # a fleet with room: no 429
        # the replicas answered exactly the calls the client saw answered, no more, no fewer
        assert sum(fig["calls_per_replica"]) == fig["calls"], name
        assert fig["prompt_tokens"] > fig["prompt_tokens_computed"] > 0, name  # some prefix was reused
        assert fig["replica_side_ms"]["e2e_mean"] is not None, name
        assert fig["call_ms_opening"]["calls"] + fig["call_ms_after_opening"]["calls"] == fig["calls"], name
        assert fig["call_ms_opening"]["calls"] >= fig["tasks"], name  # every first call is in the opening
    # round-robin is the client's: calls taken in turn; through the gateway the queue wait is reported
    per = run["round-robin"]["calls_per_replica"]
    assert max(per) - min(per) <= 1
    assert run["round-robin"]["queue_ms"] is None
    assert run["taskplane"]["queue_ms"] is not None and run["plain"]["queue_ms"] is not None
    assert set(res["ratios"][0]) == {"taskplane", "plain"}

    rows = [json.loads(line) for line in calls_out.read_text().splitlines()]
    assert len(rows) == 3 * 6
    through_gateway = [c for r in rows if r["target"] == "taskplane" for c in r["calls"]]
    assert all(c["replica"] for c in through_gateway)  # X-Taskplane-Replica named who served each call
    render_table(res)  # renders without error


def test_pin_group_pins_every_process_of_the_group(tmp_path: Path) -> None:
    """``--pin`` and the real-vLLM bench rely on it: a child of the group, started before the
    pin, runs only on the given core afterwards."""
    core = max(os.sched_getaffinity(0))
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    pid = proc.spawn([sys.executable, "-c", script], tmp_path / "sleep.log")
    try:
        proc.wait_until(lambda: len(group_members(pid)) == 2, "child started", 10, pid, tmp_path / "sleep.log")
        proc.pin_group(pid, {core})
        members = group_members(pid)
        assert len(members) == 2
        assert all(os.sched_getaffinity(p) == {core} for p in members)
    finally:
        proc.stop_pid(pid, timeout_s=2)
