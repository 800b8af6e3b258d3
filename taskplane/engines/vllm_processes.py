"""The process groups of the vLLM replicas this process started.

Every replica runs in its own process group (vLLM forks an engine core and a worker), so
stopping a replica ends exactly the processes it started. The ``Popen`` handles are kept
so the replicas are reaped, not left as zombies; ``/proc`` answers for replicas another
process started (``taskplane dev down``).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from taskplane.procfs import group_members

#: The module a replica's server runs (``python -m``): how its command line is recognised.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Popen handles of the replicas this process started, by pid (also their process group id).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def spawn(cmd: Sequence[str], *, cwd: Path, env: dict[str, str], log_path: Path) -> int:
    """Start one replica in a new process group, its output appended to ``log_path``; its pid."""
    with log_path.open("ab") as out:
        out.write(f"\n# taskplane: {' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            list(cmd), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid


def alive(pid: int) -> bool:
    proc = _CHILDREN.get(pid)
    if proc is not None:
        return proc.poll() is None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def is_server(pid: int, port: int) -> bool:
    """Guard against a recycled pid: the process must be the vLLM server on ``port``."""
    if not alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return pid in _CHILDREN
    return SERVER_MODULE.encode() in cmdline and str(port).encode() in cmdline


def ours_to_end(pid: int, port: int) -> bool:
    """The replica's server runs, or its group is one this process started that still has
    members (a server that died may leave its engine processes behind)."""
    return is_server(pid, port) or (pid in _CHILDREN and _group_alive(pid))


def _group_alive(pgid: int) -> bool:
    return any(fields[0] != "Z" for fields in group_members(pgid).values())


def reap(pid: int, timeout_s: float) -> bool:
    """Wait until the replica's whole process group is gone; True if it went in time."""
    deadline = time.monotonic() + timeout_s
    proc = _CHILDREN.get(pid)
    while True:
        if proc is not None:
            proc.poll()
        if not _group_alive(pid):
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1.0)
                _CHILDREN.pop(pid, None)
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def tail(path: str, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
