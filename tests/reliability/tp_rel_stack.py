"""The whole stack as separate, killable processes for the fault matrix: an embedded
Postgres, a Temporal dev server with its database file, simulated replicas, a gateway
(debug log: one ``attempt_recorded`` line per cost row) and a ``taskplane worker``.
Every part can be stopped and started again on the same ports and state."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx

from taskplane.bench.live_stack import pin_ports, stable_port
from taskplane.dev import processes as proc
from taskplane.dev.local import LocalCluster
from taskplane.store import embedded
from taskplane.store.outbox import FILE_NAME
from taskplane.temporal_names import dev_server_flags, temporal_binary

HERE = Path(__file__).parent


class RelStack:
    def __init__(self, workdir: Path, replicas: int = 3) -> None:
        self.workdir = workdir
        self.pg_dir = workdir / "pg" / "data"
        self.pg_port = stable_port()
        self.temporal_port = stable_port()
        self.temporal_pid: int | None = None
        self.worker_pid: int | None = None
        self.database_url = embedded.url_for(self.pg_port)
        # parts restart on their ports: keep them out of the ephemeral range, where an
        # outgoing connection could take a port while its server is down
        self.cluster = pin_ports(LocalCluster(workdir, replicas=replicas, gpus=["h100", "l40s", "h100"],
                                              database_url=self.database_url, speed=5.0))
        # TASKPLANE_RELIABILITY_REQUEST_TIMEOUT_S sets the gateway's limits.request_timeout_s: by
        # default (120 s) the agents' 8 s attempt timeout gives up on a hung replica first; below
        # it, Envoy gives up on that try itself and retries on the picker's fallback
        limit = os.environ.get("TASKPLANE_RELIABILITY_REQUEST_TIMEOUT_S")
        if limit:
            self.cluster.config_overrides["limits"] = {"request_timeout_s": float(limit)}
        # the gateway's outbox on a small filesystem of its own, so the disk-full fault can
        # fill it (needs mount rights: root in a container; else that fault is skipped)
        self.outbox_fs: Path | None = workdir / "outbox-fs"
        self.outbox_fs.mkdir(parents=True, exist_ok=True)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(self.outbox_fs)],
                                 capture_output=True).returncode == 0
        if mounted:
            self.cluster.config_overrides["outbox_dir"] = str(self.outbox_fs / "outbox")
        else:
            self.outbox_fs = None

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    def log(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    # ---- parts -------------------------------------------------------------------------
    def start_postgres(self) -> None:
        embedded.start(self.pg_dir, self.pg_port)

    def stop_postgres(self) -> None:
        embedded.stop(self.pg_dir, mode="fast")

    def start_temporal(self) -> None:
        cmd = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(self.temporal_port),
               "--headless", "--db-filename", str(self.workdir / "temporal.db"), "--log-level", "warn",
               *dev_server_flags()]
        self.temporal_pid = proc.spawn(cmd, self.log("temporal"))
        proc.wait_until(proc.tcp_open(self.temporal_port), "Temporal dev server", 60, self.temporal_pid, self.log("temporal"))

    def stop_temporal(self) -> None:
        proc.stop_pid(self.temporal_pid)
        self.temporal_pid = None

    def start_worker(self) -> None:
        env = {"TASKPLANE_TEMPORAL_ADDRESS": self.temporal_address, "TASKPLANE_GATEWAY_URL": self.cluster.gateway_url,
               "TASKPLANE_DATABASE_URL": self.database_url, "TASKPLANE_STATE_DIR": str(self.workdir),
               "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        log = self.log("worker")
        mark = log.stat().st_size if log.exists() else 0
        self.worker_pid = proc.spawn([sys.executable, "-m", "taskplane.cli", "worker", "--module", "tp_rel_agents"], log, env=env)
        proc.wait_until(lambda: "worker_started" in log.read_bytes()[mark:].decode(errors="replace"), "worker", 60,
                        self.worker_pid, log)

    def kill_worker(self) -> None:
        """SIGKILL: no graceful shutdown, in-flight activities are abandoned."""
        import signal

        if self.worker_pid and proc.alive(self.worker_pid):
            os.killpg(self.worker_pid, signal.SIGKILL)
            proc.stop_pid(self.worker_pid, timeout_s=2)
        self.worker_pid = None

    def start(self) -> RelStack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.environ["TASKPLANE_LOG_LEVEL"] = "debug"  # inherited by the gateway: attempt_recorded lines
        try:
            self.start_postgres()
            from taskplane.store.migrate import upgrade

            upgrade(self.database_url)
            self.start_temporal()
            self.cluster.start()
            self.start_worker()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        os.environ.pop("TASKPLANE_LOG_LEVEL", None)
        proc.stop_pid(self.worker_pid)
        self.cluster.stop()
        self.stop_temporal()
        embedded.destroy(self.pg_dir)
        if self.outbox_fs is not None:
            subprocess.run(["umount", "-l", str(self.outbox_fs)], capture_output=True)

    def kill_postgres(self) -> None:
        """SIGKILL the postmaster (no shutdown checkpoint); its backends die with it."""
        pid = int((self.pg_dir / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, signal.SIGKILL)

    def restart_killed_postgres(self, bound_s: float = 60.0) -> None:
        """Start Postgres again after a SIGKILL (crash recovery), once its orphans are gone."""
        deadline = time.monotonic() + bound_s
        while True:
            try:
                embedded.start(self.pg_dir, self.pg_port)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def fill_outbox_fs(self) -> None:
        """Fill the outbox's filesystem to the last byte (ENOSPC for the gateway's outbox).

        SQLite reuses the WAL file's pages after a checkpoint, so a full disk alone is not
        felt until the WAL must grow: it is checkpointed and truncated first (from this
        process, as any other SQLite client may), so the gateway's next commit must grow it."""
        assert self.outbox_fs is not None
        db = self.outbox_fs / "outbox" / FILE_NAME
        if db.exists():
            with closing(sqlite3.connect(db, timeout=30)) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        try:
            fd = os.open(self.outbox_fs / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError:
            return  # already full
        try:
            for chunk in (1 << 20, 1 << 12, 1 << 9, 1):
                try:
                    while True:
                        os.write(fd, b"\0" * chunk)
                except OSError:
                    continue  # ENOSPC at this size: go on with smaller writes
        finally:
            os.close(fd)

    def free_outbox_fs(self) -> None:
        assert self.outbox_fs is not None
        (self.outbox_fs / "filler").unlink(missing_ok=True)

    # ---- views -------------------------------------------------------------------------
    def gateway_rows(self, prefix: str) -> list[dict[str, Any]]:
        """The cost rows the gateway handed to its writer for tasks starting with ``prefix``
        (from its log, which survives gateway restarts)."""
        out = []
        for line in _lines(self.log("gateway")):
            if '"attempt_recorded"' in line:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if str(rec.get("task_id") or "").startswith(prefix):
                    out.append(rec)
        return out

    async def kv_views(self) -> dict[str, dict[str, Any]]:
        async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
            reps = (await client.get(f"{self.cluster.gateway_url}/admin/replicas")).json()["replicas"]
            out = {}
            for r in reps:
                rep = next(x for x in self.cluster.replicas if x.name == r["name"])
                try:
                    state = (await client.get(f"{rep.url}/admin/state")).json()
                except httpx.HTTPError:
                    state = None
                out[r["name"]] = {"gateway": r, "replica": state}
            return out


def _lines(path: Path) -> Iterator[str]:
    if path.exists():
        with path.open(errors="replace") as f:
            yield from f


#: Rows of the fault matrix, filled by test_fault_matrix.py and printed at the end of the run.
MATRIX: list[dict[str, Any]] = []

COLUMNS = [("fault", 24), ("tasks", 6), ("ok", 4), ("failed", 7), ("lost", 5), ("rows", 5), ("in db", 6),
           ("lost", 5), ("doubled", 8), ("not ok", 7), ("gw lost", 8), ("max gpu s", 10), ("kv sync s", 10),
           ("wall s", 7)]


def render_matrix(rows: list[dict[str, Any]] | None = None) -> str:
    rows = MATRIX if rows is None else rows
    head = "".join(f"{name:>{w}}" if i else f"{name:<{w}}" for i, (name, w) in enumerate(COLUMNS))
    lines = ["fault matrix (tasks: ok / failed with a recorded failure / lost; cost rows: handed over by the gateway,",
             "in Postgres, lost, doubled, how many of them record a failed attempt, and how many of those a killed gateway's",
             "successor recorded from its in-flight journal; the most GPU time one attempt was charged; KV view back in",
             "sync after)", head]
    for r in rows:
        kv = "-" if r["kv_recovery_s"] is None else f"{r['kv_recovery_s']:.1f}"
        vals = [r["fault"], r["tasks"], r["ok"], r["failed"], r["lost"], r["rows_gateway"], r["rows_db"],
                r["rows_lost"], r["rows_doubled"], r["rows_not_success"], r.get("rows_gateway_lost", 0),
                f"{r.get('gpu_s_max', 0.0):.2f}", kv, f"{r['wall_s']:.0f}"]
        lines.append("".join(f"{v!s:>{w}}" if i else f"{v!s:<{w}}" for i, (v, (_, w)) in enumerate(zip(vals, COLUMNS, strict=True))))
    return "\n".join(lines)
