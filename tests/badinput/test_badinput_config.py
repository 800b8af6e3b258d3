"""``taskplane gateway --config BAD`` exits non-zero with one clear line naming the field,
and never opens its port. Each file of corpus/configs/ says what its error line must
contain in a ``# expect:`` comment."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taskplane.ports import free_port

CONFIGS = sorted((Path(__file__).parent / "corpus" / "configs").glob("*.yaml"))


def _expect(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect:"), f"{path.name} needs a '# expect: ...' first line"
    return first.split(":", 1)[1].strip()


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _run_gateway(config: Path, port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "taskplane.cli", "gateway", "--config", str(config), "--port", str(port)],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200",
                                                          "TASKPLANE_STATE_DIR": str(config.parent)},
    )


def test_there_are_bad_configs() -> None:
    assert len(CONFIGS) >= 10


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_bad_config_is_one_clear_line_and_no_port(config: Path, tmp_path: Path) -> None:
    port = free_port()
    local = tmp_path / config.name
    local.write_text(config.read_text())
    proc = _run_gateway(local, port)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: gateway config") and _expect(config) in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not _port_open(port)


def test_missing_config_file(tmp_path: Path) -> None:
    port = free_port()
    proc = _run_gateway(tmp_path / "nope.yaml", port)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no such file" in lines[0]
    time.sleep(0.2)
    assert not _port_open(port)
