"""Fixtures for the SDK tests: a taskplane client on the shared Temporal dev server, a
header-recording endpoint, a real gateway cluster, and in-process workers for each."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client
from tp_sdk_recorder import Recorder
from tp_sdk_workers import serving_worker

from taskplane.dev.local import LocalCluster
from taskplane.sdk.client import taskplane_client
from workflows.worker import TaskplaneWorker

AGENTS_MODULE = "tp_sdk_agents"


@pytest.fixture(scope="session")
def recorder() -> Iterator[Recorder]:
    rec = Recorder().start()
    try:
        yield rec
    finally:
        rec.stop()


@pytest.fixture
def rec(recorder: Recorder) -> Recorder:
    recorder.reset()
    return recorder


@pytest_asyncio.fixture(scope="session")
async def tp_client(temporal_env: Any) -> Client:
    return taskplane_client(temporal_env.client)


@pytest_asyncio.fixture(scope="session")
async def rec_worker(tp_client: Client, recorder: Recorder, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TaskplaneWorker]:
    """A worker whose gateway is the header recorder (no database)."""
    async with serving_worker(tp_client, recorder.url, None, [AGENTS_MODULE], queue_prefix="sdk-rec") as worker:
        yield worker


@pytest.fixture(scope="session")
def gw_cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three simulated replicas behind the real gateway, recording to the real Postgres."""
    c = LocalCluster(Path(tmp_path_factory.mktemp("sdk-gw")), replicas=3, gpus=["h100", "l40s", "h100"],
                     database_url=pg_url, speed=50.0)
    with c:
        yield c


@pytest_asyncio.fixture(scope="session")
async def gw_worker(
    tp_client: Client, gw_cluster: LocalCluster, pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[TaskplaneWorker]:
    """A worker sending LLM calls through the gateway and task rows to Postgres."""
    async with serving_worker(tp_client, gw_cluster.gateway_url, pg_url, [AGENTS_MODULE], queue_prefix="sdk-gw",
                              outbox_dir=tmp_path_factory.mktemp("sdk-outbox")) as worker:
        yield worker
