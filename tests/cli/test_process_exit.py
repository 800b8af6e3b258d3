"""A finished command ends with its own status, its output and atexit work done, even past
the Temporal core's threads (which can abort CPython's finalization)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_SCRIPT = textwrap.dedent("""
    import atexit, sys
    from pathlib import Path
    if {load_bridge}:
        import temporalio.bridge.temporal_sdk_bridge  # noqa: F401
    from taskplane.process_exit import exit_past_native_threads
    atexit.register(lambda: Path({marker!r}).write_text("ran"))
    sys.stdout.write("unflushed result")  # no newline, no flush: must still reach the pipe
    exit_past_native_threads(3)
""")


@pytest.mark.parametrize("load_bridge", [True, False])
def test_status_output_and_atexit_survive(tmp_path: Path, load_bridge: bool) -> None:
    marker = tmp_path / "atexit-ran"
    script = _SCRIPT.format(load_bridge=load_bridge, marker=str(marker))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "unflushed result"
    assert marker.read_text() == "ran"


def test_a_sys_exit_message_is_printed_and_exits_1() -> None:
    from taskplane.process_exit import exit_code_of

    assert exit_code_of(SystemExit()) == 0
    assert exit_code_of(SystemExit(4)) == 4
    assert exit_code_of(SystemExit("bad")) == 1
