"""A simulated replica served in the test's own event loop (for tests that scrape or call
one replica without starting a process)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

from taskplane.ports import free_port
from taskplane.sim.http_replica import ReplicaOptions, SimReplica
from taskplane.sim.server import create_app


@contextlib.asynccontextmanager
async def sim_replica(**replica: Any) -> AsyncIterator[str]:
    """Serve a replica of ``ReplicaOptions(**replica)`` on a free loopback port; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(SimReplica(ReplicaOptions(**{"port": port, **replica}))), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "the simulated replica did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
