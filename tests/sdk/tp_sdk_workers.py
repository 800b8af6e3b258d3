"""One way to run an in-process worker for the SDK tests' fixtures."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from temporalio.client import Client

from workflows.worker import TaskplaneWorker, build_worker


@asynccontextmanager
async def serving_worker(
    client: Client, gateway_url: str | None, database_url: str | None, modules: Sequence[str], *,
    queue_prefix: str, outbox_dir: Path | None = None,
) -> AsyncIterator[TaskplaneWorker]:
    """A worker serving ``modules`` only (no examples) on a task queue of its own: the random
    suffix keeps the workers of different test modules from taking each other's tasks."""
    worker = await build_worker(client, gateway_url, database_url, modules,
                                task_queue=f"{queue_prefix}-{uuid.uuid4().hex[:8]}", include_examples=False,
                                outbox_dir=outbox_dir)
    async with worker:
        yield worker
