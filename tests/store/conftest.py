"""Fixtures for the store tests: a fresh, migrated database per test on the shared server,
so rows written by other test areas never mix into the numbers checked here."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from taskplane.store import db
from taskplane.store.migrate import upgrade


@pytest_asyncio.fixture
async def fresh_db_url(pg_server_url: str) -> AsyncIterator[str]:
    """An empty database with taskplane's schema at head; dropped afterwards."""
    url = await db.create_database(pg_server_url)
    upgrade(url)
    try:
        yield url
    finally:
        await db.drop_database(url)
