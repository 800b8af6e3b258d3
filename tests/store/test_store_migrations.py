"""Migrations apply to a real Postgres, are idempotent, and create the documented schema."""

from __future__ import annotations

import asyncio
import socket

import pytest
from sqlalchemy import text

from taskplane.errors import UserError
from taskplane.store import db
from taskplane.store.migrate import downgrade, upgrade

EXPECTED_TABLES = {"tasks", "llm_calls", "prices", "alembic_version"}
EXPECTED_VIEWS = {
    "cost_per_successful_task",
    "cost_per_successful_task_by_agent",
    "cost_per_successful_task_by_tenant",
    "cost_per_successful_task_by_day",
    "llm_call_waste",
    "waste_breakdown",
}


async def _names(url: str, kind: str) -> set[str]:
    engine = db.create_engine(url)
    try:
        async with engine.connect() as conn:
            if kind == "table":
                q = "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            else:
                q = "SELECT viewname FROM pg_views WHERE schemaname = 'public'"
            return {r[0] for r in (await conn.execute(text(q))).all()}
    finally:
        await engine.dispose()


async def test_shared_fixture_is_at_head(pg_url: str) -> None:
    assert EXPECTED_TABLES <= await _names(pg_url, "table")
    assert EXPECTED_VIEWS <= await _names(pg_url, "view")


async def test_upgrade_twice_and_concurrently_is_a_no_op(fresh_db_url: str) -> None:
    upgrade(fresh_db_url)  # called from inside a running event loop: runs in a thread
    await asyncio.gather(*(asyncio.to_thread(upgrade, fresh_db_url) for _ in range(3)))
    engine = db.create_engine(fresh_db_url)
    try:
        async with engine.connect() as conn:
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar_one()
            prices = (await conn.execute(text("SELECT count(*) FROM prices WHERE version = 1"))).scalar_one()
            indexes = {
                r[0]
                for r in (await conn.execute(text("SELECT indexname FROM pg_indexes WHERE tablename = 'llm_calls'"))).all()
            }
    finally:
        await engine.dispose()
    assert version == "0006_call_prefill_replica"
    assert prices >= 5
    assert {"ix_llm_calls_task_id", "ix_llm_calls_started_at", "ix_llm_calls_tenant"} <= indexes
    assert any("attempt_key" in name for name in indexes)


async def test_downgrade_to_base_and_back(fresh_db_url: str) -> None:
    downgrade(fresh_db_url, "base")
    assert await _names(fresh_db_url, "table") == {"alembic_version"}
    upgrade(fresh_db_url)
    assert EXPECTED_VIEWS <= await _names(fresh_db_url, "view")


def test_unreachable_postgres_is_one_clear_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{port}/taskplane"
    with pytest.raises(UserError) as info:
        upgrade(url)
    message = str(info.value)
    assert "cannot reach Postgres" in message and "\n" not in message


def test_bad_url_is_a_user_error() -> None:
    with pytest.raises(UserError, match="unsupported database URL"):
        upgrade("mysql://x@y/z")


async def _llm_call_columns(url: str) -> set[str]:
    engine = db.create_engine(url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'llm_calls'"))).all()
    finally:
        await engine.dispose()
    return {r[0] for r in rows}


async def test_adapter_column_upgrades_and_downgrades(fresh_db_url: str) -> None:
    assert "adapter" in await _llm_call_columns(fresh_db_url)
    downgrade(fresh_db_url, "0004_sub_agent_rollup")
    assert "adapter" not in await _llm_call_columns(fresh_db_url)
    assert EXPECTED_VIEWS <= await _names(fresh_db_url, "view")
    upgrade(fresh_db_url)
    assert "adapter" in await _llm_call_columns(fresh_db_url)
