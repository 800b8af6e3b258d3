"""Bad command lines and unreachable services: one clear line, a non-zero exit, nothing
left running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from taskplane.ports import free_port


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "taskplane.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _one_error_line(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert res.returncode != 0
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_unknown_option_is_refused() -> None:
    res = _run(["dev", "up", "--bogus"])
    assert res.returncode == 2
    assert "No such option: --bogus" in res.stderr


@pytest.mark.parametrize(
    ("text", "needle"),
    [("pools: [\n", "not valid YAML"), ("pools:\n  - replicas: []\n", "pools.0.model"), ("tenants: []\n", "pools"),
     ("pools:\n  - model: m\n    replicas:\n      - url: ftp://x\n", "http://")],
)
def test_bad_gateway_config_is_one_line_and_opens_no_port(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(text)
    port = free_port()
    res = _run(["gateway", "--config", str(cfg), "--port", str(port)])
    _one_error_line(res, str(cfg), needle)


def test_unreachable_postgres_and_temporal(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    res = _run(["report"], env={"TASKPLANE_DATABASE_URL": f"postgresql+asyncpg://x@{dead}/db", "TASKPLANE_STATE_DIR": str(tmp_path)})
    _one_error_line(res, "Postgres", "TASKPLANE_DATABASE_URL")
    res = _run(["db", "upgrade"], env={"TASKPLANE_DATABASE_URL": "mysql://x@h/db", "TASKPLANE_STATE_DIR": str(tmp_path)})
    _one_error_line(res, "postgresql+asyncpg://")
    res = _run(["run", "examples.research:research_agent", "--arg", "x"],
               env={"TASKPLANE_TEMPORAL_ADDRESS": dead, "TASKPLANE_GATEWAY_URL": "http://127.0.0.1:9",
                    "TASKPLANE_STATE_DIR": str(tmp_path)})
    _one_error_line(res, "Temporal")


def test_dev_up_with_a_taken_port_starts_nothing(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        base = s.getsockname()[1]
        res = _run(["dev", "up", "--state-dir", str(tmp_path), "--base-port", str(base)])
    _one_error_line(res, f"port {base}", "--base-port")
    assert not (tmp_path / "stack.json").exists()
