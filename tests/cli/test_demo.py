"""`taskplane demo`, the README's first command: it brings the embedded stack up, runs a
fleet of agent tasks through Temporal, the gateway and the replicas, and ends with the cost
report read back from Postgres."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from taskplane.dev.ports import free_base


def _cli(*args: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "taskplane.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def _total_cost(out: str) -> float:
    """The report's "Total cost" figure, in USD."""
    match = re.search(r"Total cost\s+\$([0-9.]+)", out)
    assert match, out[-4000:]
    return float(match.group(1))


def test_demo_runs_a_fleet_and_prints_the_cost_report(tmp_path: Path) -> None:
    state = tmp_path / "state"
    try:
        res = _cli("demo", "--state-dir", str(state), "--tasks", "8", "--base-port", str(free_base(3)))
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        assert "running the agent fleet" in out and "cost report for this run" in out
        assert "tasks succeeded" in out
        assert "cost per successful task" in out.lower()
        assert _total_cost(out) > 0, out[-4000:]
        status = json.loads(_cli("dev", "status", "--state-dir", str(state), "--json").stdout)
        assert status["running"], status
        # a second demo on the running stack does real work too: its prompts are its own, so
        # the gateway's response cache does not answer them (the report would show $0)
        again = _cli("demo", "--state-dir", str(state), "--tasks", "6", "--base-port", str(status["base_port"]))
        out = again.stdout + again.stderr
        assert again.returncode == 0, out[-4000:]
        assert "found the running dev stack" in out
        assert _total_cost(out) > 0, out[-4000:]
    finally:
        _cli("dev", "down", "--state-dir", str(state), timeout=120)
    assert not json.loads(_cli("dev", "status", "--state-dir", str(state), "--json").stdout)["running"]
