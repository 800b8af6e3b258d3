"""Replicas from a file (``discovery: {source: file, path: ...}``): the dev stack's
autoscaler writes the pool's replicas there (atomically, by rename) as they start, drain
and stop; the gateway re-reads it when it changes, as it follows Kubernetes endpoints."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from taskplane.config import PoolConfig, ReplicaConfig

log = structlog.get_logger("taskplane.discovery")
POLL_S = 0.25


def read_replicas(path: Path) -> list[ReplicaConfig] | None:
    """The file's replicas, or None while it is missing or half-written."""
    try:
        data = json.loads(path.read_text())
        return [ReplicaConfig.model_validate(r) for r in data.get("replicas", [])]
    except (OSError, ValueError) as exc:
        log.debug("replicas_file_unreadable", path=str(path), error=str(exc))
        return None


def write_replicas(path: Path, replicas: list[dict[str, object]]) -> None:
    """Write atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"replicas": replicas}, indent=1))
    tmp.replace(path)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


async def watch_file(pool: PoolConfig, on_change: Callable[[list[ReplicaConfig]], Awaitable[None] | None]) -> None:
    """Follow the pool's replicas file until cancelled (polls its modification time)."""
    assert pool.discovery is not None and pool.discovery.path is not None
    path = Path(pool.discovery.path)
    seen: tuple[int, int] | None = None
    while True:
        stamp = await asyncio.to_thread(_stamp, path)
        if stamp is not None and stamp != seen:
            replicas = await asyncio.to_thread(read_replicas, path)
            if replicas is not None:
                seen = stamp
                result = on_change(replicas)
                if inspect.isawaitable(result):
                    await result
        await asyncio.sleep(POLL_S)
