"""Reading the cost tables in tests (the gateway writes llm_calls asynchronously)."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from taskplane.store.db import create_engine


async def rows(pg_url: str, sql: str, **params: object) -> list[dict[str, object]]:
    engine = create_engine(pg_url, pool_size=1)
    try:
        async with engine.connect() as conn:
            return [dict(r._mapping) for r in (await conn.execute(text(sql), params)).all()]
    finally:
        await engine.dispose()


async def calls(pg_url: str, task_id: str, expect: int, timeout: float = 10) -> list[dict[str, object]]:
    """The task's llm_calls rows once ``expect`` of them have landed."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        found = await rows(pg_url, "SELECT * FROM llm_calls WHERE task_id = :t ORDER BY step, attempt, started_at", t=task_id)
        if len(found) >= expect or loop.time() > end:
            return found
        await asyncio.sleep(0.2)


async def wait_status(handle: object, status: str, timeout: float = 20) -> None:
    """Poll the task's ``state`` query until it reports ``status``."""
    for _ in range(int(timeout / 0.1)):
        if (await handle.state()).status == status:  # type: ignore[attr-defined]
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"task never reached {status!r}")
