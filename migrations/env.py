"""Alembic environment: async migrations over asyncpg, one at a time per database.

The URL comes from ``taskplane.store.migrate.upgrade`` (config attribute
``database_url``), else ``sqlalchemy.url``, else ``TASKPLANE_DATABASE_URL``. A
transaction-scoped advisory lock serialises concurrent upgraders (``dev up`` and a test
session may race): the second waits, then finds the schema at head and does nothing.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy import pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from taskplane.store.db import normalize_url
from taskplane.store.models import Base

config = context.config
target_metadata = Base.metadata

#: pg_advisory_xact_lock key: "taskplane" in ASCII, folded into a bigint.
_LOCK_KEY = 0x7461736B706C616E


def _url() -> str:
    url = (
        config.attributes.get("database_url")
        or config.get_main_option("sqlalchemy.url")
        or os.environ.get("TASKPLANE_DATABASE_URL")
    )
    if not url:
        raise RuntimeError("no database URL: set TASKPLANE_DATABASE_URL or use `taskplane db upgrade`")
    return normalize_url(str(url))


def run_migrations_offline() -> None:
    """Emit SQL instead of running it (``alembic upgrade head --sql``)."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _do_run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
        context.run_migrations()


async def _run_async_migrations() -> None:
    engine = create_async_engine(_url(), poolclass=pool.NullPool, connect_args={"timeout": 10})
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_do_run_migrations)
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    asyncio.run(_run_async_migrations())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
