"""Background processes of the dev stack: start detached, wait until ready, stop by pid.

Each process gets its own session (process group) so ``dev down`` stops it and all of
its children, and its output goes to a log file under the state directory.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from taskplane.errors import UserError
from taskplane.procfs import group_members


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def ensure_ports_free(ports: dict[str, int]) -> None:
    for what, port in ports.items():
        if port_in_use(port):
            raise UserError(
                f"port {port} (for {what}) is already taken; stop what uses it, or run `taskplane dev up --base-port N`"
            )


def spawn(cmd: Sequence[str], log_file: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> int:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
        )
    return proc.pid


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def pin_group(pgid: int, cores: set[int]) -> None:
    """Pin every thread of every process in group ``pgid`` to ``cores`` (threads started
    later inherit the mask): benches that give each part a fixed share of the machine."""
    for pid in group_members(pgid):
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cores)
            except OSError:
                pass


def stop_pid(pid: int | None, timeout_s: float = 8.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left."""
    if not alive(pid):
        return
    assert pid is not None
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not alive(pid):
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                return
            time.sleep(0.1)


def wait_until(check: Callable[[], bool], what: str, timeout_s: float, pid: int | None = None, log_file: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pid is not None and not alive(pid):
            tail = log_file.read_text(errors="replace")[-800:] if log_file and log_file.exists() else ""
            raise UserError(f"{what} exited during start-up (log {log_file}): {tail.strip()}")
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise UserError(f"{what} did not become ready within {timeout_s:.0f} s (log {log_file})")


def http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        return httpx.get(url, timeout=1.0).status_code == 200

    return check


def tcp_open(port: int) -> Callable[[], bool]:
    return lambda: port_in_use(port)
