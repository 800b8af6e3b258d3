"""The processes a live bench starts on loopback, and how it measures them.

Shared by ``gateway_load`` and ``agent_sessions``: ports out of the kernel's ephemeral
range (a load run opens thousands of outgoing connections), CPU and memory of the gateway's
process tree, core pinning, an embedded Postgres for the attempt rows and their count,
and the replicas' cold start for each run (prefix caches reset, KV events live).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import resource
import socket
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from taskplane.dev.local import LocalCluster, LocalReplica
from taskplane.errors import UserError


def cpu_by_process(proc: psutil.Process) -> dict[str, float]:
    """User + system CPU seconds of a process (``gateway``: the picker and the HTTP app, or
    the Python proxy) and of its live children by name (``envoy`` under the front door)."""
    out: dict[str, float] = {}
    try:
        procs = [("gateway", proc), *((c.name(), c) for c in proc.children(recursive=True))]
    except psutil.Error:
        return out
    for name, p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[name] = out.get(name, 0.0) + t.user + t.system
    return out


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU of a process and its live children (Envoy under the front door)."""
    return sum(cpu_by_process(proc).values())


class RssSampler:
    """Peak resident memory of a process (and its children) while a phase runs."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        self.proc = psutil.Process(pid)
        self.interval_s = interval_s
        self.peak = 0
        self.baseline = self._rss()
        self._task: asyncio.Task[None] | None = None

    def _rss(self) -> int:
        try:
            procs = [self.proc, *self.proc.children(recursive=True)]
            return sum(p.memory_info().rss for p in procs)
        except psutil.Error:
            return 0

    async def _loop(self) -> None:
        while True:
            self.peak = max(self.peak, self._rss())
            await asyncio.sleep(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.ensure_future(self._loop())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()
        self.peak = max(self.peak, self._rss())


def stable_port(low: int = 20000, high: int = 31000) -> int:
    """A free port below the kernel's ephemeral range (32768+ by default): a port picked by
    binding port 0 can be taken by one of the thousands of outgoing connections a load run
    opens before the server binds it."""

    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # the sim's replay port (+1000) too
            try:
                s.bind(("127.0.0.1", port + 1000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port found below the ephemeral range")


def pin_ports(cluster: LocalCluster) -> LocalCluster:
    """Move a LocalCluster's ports out of the ephemeral range (see ``stable_port``)."""
    for r in cluster.replicas:
        r.port, r.kv_port = stable_port(), stable_port()
    cluster.gateway_port = stable_port()
    return cluster


def raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, need)) if hard != resource.RLIM_INFINITY else max(soft, need)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


async def count_rows(database_url: str) -> dict[str, Any]:
    """Attempt rows by outcome, how many call keys have more than one success row, and the
    other rows by outcome and error type."""
    from sqlalchemy import text

    from taskplane.store.db import create_engine

    engine = create_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = {str(o): int(n) for o, n in await conn.execute(text("SELECT outcome, count(*) FROM llm_calls GROUP BY 1"))}
            doubled = (await conn.execute(text(
                "SELECT count(*) FROM (SELECT split_part(attempt_key, ':', 1), split_part(attempt_key, ':', 2) "
                "FROM llm_calls WHERE outcome = 'success' GROUP BY 1, 2 HAVING count(*) > 1) d"))).scalar_one()
            why = {f"{o}/{e}": int(n) for o, e, n in await conn.execute(text(
                "SELECT outcome, error_type, count(*) FROM llm_calls WHERE outcome <> 'success' GROUP BY 1, 2"))}
    finally:
        await engine.dispose()
    return {**rows, "calls_with_two_success_rows": int(doubled), **({"not_success": why} if why else {})}


@contextlib.contextmanager
def embedded_postgres(workdir: Path) -> Any:
    """An embedded Postgres with taskplane's schema for the run, stopped and removed after."""
    from taskplane.ports import free_port
    from taskplane.store import embedded
    from taskplane.store.migrate import upgrade

    data = workdir / "pg" / "data"
    url = embedded.start(data, free_port())
    try:
        upgrade(url)
        yield url
    finally:
        embedded.destroy(data)


def start_cluster(cluster: LocalCluster, attempts: int = 3) -> LocalCluster:
    """Start it on ports below the ephemeral range; a start that lost a port race to
    another process on a shared machine is tried again on new ports."""
    for attempt in range(1, attempts + 1):
        try:
            return pin_ports(cluster).start()
        except UserError as exc:
            if attempt == attempts or "Address already in use" not in str(exc):
                raise
    raise AssertionError("unreachable")


def reset_caches(client: httpx.Client, replicas: Sequence[LocalReplica], timeout_s: float = 30.0) -> None:
    """Empty every replica's prefix cache (a run starts cold, as the last one did)."""
    deadline = time.monotonic() + timeout_s
    for r in replicas:
        while client.post(f"{r.url}/reset_prefix_cache").status_code != 200:  # 500 while blocks are in use
            if time.monotonic() > deadline:
                raise RuntimeError(f"{r.name}: prefix cache still in use after {timeout_s} s")
            time.sleep(0.2)


def warm(client: httpx.Client, replicas: Sequence[LocalReplica]) -> None:
    """One small call straight to each replica: its first full block makes it publish a KV
    event, so the gateway (which subscribed after the replica started) sees its events live."""
    for r in replicas:
        prompt = uuid.uuid4().hex * 4  # 128 tokens: 8 full blocks
        client.post(f"{r.url}/v1/completions", json={"model": r.model, "prompt": prompt, "max_tokens": 2}).raise_for_status()


def wait_gateway_live(client: httpx.Client, url: str, replicas: Sequence[LocalReplica], timeout_s: float = 60.0) -> None:
    """Until the gateway sees every replica healthy with its KV events live."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = client.get(f"{url}/admin/replicas", timeout=5.0).json()["replicas"]
        if len(view) == len(replicas) and all(v["healthy"] and v.get("kv_events_live", True) for v in view):
            return
        warm(client, replicas)
        time.sleep(0.5)
    raise RuntimeError(f"gateway {url}: replicas not healthy with live KV events after {timeout_s} s")


def pin_tree(pid: int, cores: set[int]) -> None:
    """Pin every thread of a process and its descendants to ``cores``."""
    root = psutil.Process(pid)
    for p in (root, *root.children(recursive=True)):
        with contextlib.suppress(psutil.Error):
            for t in p.threads():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(t.id, cores)


def pin_gateway_apart(cluster: LocalCluster) -> dict[str, list[int]]:
    """The gateway (picker and Envoy) on the last core, replicas and this client on the
    others: a router host of its own, as in production, and every target's replicas and
    client get the same CPU (the gateway idles in the round-robin run)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or cluster.gateway_pid is None:
        raise RuntimeError("--pin needs at least 2 cores and a running gateway")
    apart, rest = {cores[-1]}, set(cores[:-1])
    pin_tree(cluster.gateway_pid, apart)
    for r in cluster.replicas:
        if r.pid is not None:
            pin_tree(r.pid, rest)
    pin_tree(os.getpid(), rest)
    return {"gateway": sorted(apart), "replicas_and_client": sorted(rest)}
