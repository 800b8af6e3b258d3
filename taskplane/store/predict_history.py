"""The prediction layer's start-up history from Postgres: each finished task's agent,
tenant, successful calls, their output lengths and the gaps between them, so a restarted
picker predicts from the first call instead of learning again from nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from taskplane.scheduler.predict import Predictor, TaskHistory

_TASKS = text("""
    WITH c AS (
        SELECT task_id, step, completion_tokens, started_at,
               EXTRACT(EPOCH FROM (started_at - LAG(started_at) OVER w)) - LAG(total_ms) OVER w / 1000.0 AS gap_s
        FROM llm_calls WHERE outcome = 'success' AND task_id IS NOT NULL
        WINDOW w AS (PARTITION BY task_id ORDER BY started_at))
    SELECT t.task_id, t.agent, t.tenant, COUNT(c.step) AS calls,
           ARRAY_AGG(c.completion_tokens ORDER BY c.started_at) AS outputs,
           ARRAY_AGG(c.gap_s ORDER BY c.started_at) AS gaps
    FROM tasks t JOIN c ON c.task_id = t.task_id
    WHERE t.status = 'succeeded' AND t.finished_at IS NOT NULL AND t.started_at >= :since
    GROUP BY t.task_id, t.agent, t.tenant, t.finished_at
    ORDER BY t.finished_at DESC
    LIMIT :limit
""")


async def task_histories(engine: AsyncEngine, *, since: datetime | None = None, limit: int = 20_000) -> list[TaskHistory]:
    """The most recent ``limit`` succeeded tasks started since ``since`` (default: a week ago)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    lo = since or datetime.now(UTC) - timedelta(days=7)
    async with engine.connect() as conn:
        rows = (await conn.execute(_TASKS, {"since": lo, "limit": limit})).mappings().all()
    out: list[TaskHistory] = []
    for r in rows:
        gaps = tuple((None, max(float(g), 0.0)) for g in (r["gaps"] or []) if g is not None)
        out.append(TaskHistory(agent=r["agent"] or "default", tenant=r["tenant"] or "default", calls=int(r["calls"]),
                               output_tokens=tuple(int(x) for x in (r["outputs"] or []) if x is not None),
                               gaps_s=gaps))
    return out


async def seed_predictor(predictor: Predictor, engine: AsyncEngine, *, since: datetime | None = None,
                         limit: int = 20_000) -> int:
    """Teach ``predictor`` the store's recent history; returns the tasks read."""
    return predictor.seed(await task_histories(engine, since=since, limit=limit))
