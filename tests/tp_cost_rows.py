"""The cost rows a live stack wrote for some tasks, read straight from its Postgres."""

from __future__ import annotations

import asyncio

import asyncpg


async def cost_rows(database_url: str, task_ids: list[str], n: int) -> list[asyncpg.Record]:
    """The ``llm_calls`` rows of ``task_ids``, once there are ``n`` of them (or after 30 s:
    the gateway's outbox delivers rows within moments)."""
    conn = await asyncpg.connect(database_url.replace("+asyncpg", ""))
    try:
        for _ in range(150):
            rows = list(await conn.fetch("SELECT * FROM llm_calls WHERE task_id = ANY($1::text[])", task_ids))
            if len(rows) >= n:
                break
            await asyncio.sleep(0.2)
        return rows
    finally:
        await conn.close()
