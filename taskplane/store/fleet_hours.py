"""fleet_hours rows: the provisioned replica intervals the autoscaler's fleet book records,
so the cost report charges idle GPU-hours too (cost per successful task fully loaded)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


class Interval(Protocol):
    """One provisioned replica interval, in seconds from an epoch (the autoscaler's
    ``FleetInterval`` is one): what a fleet_hours row is written from."""

    pool: str
    replica: str
    gpu: str
    cost_per_hour_usd: float
    started_s: float
    ready_s: float | None
    stopped_s: float | None
    stop_reason: str | None
    killed_inflight: int


_UPSERT = text("""
    INSERT INTO fleet_hours (pool, replica, gpu, cost_per_hour_usd, started_at, ready_at, stopped_at,
                             stop_reason, killed_inflight)
    VALUES (:pool, :replica, :gpu, :cost, :started, :ready, :stopped, :reason, :killed)
    ON CONFLICT (replica, started_at) DO UPDATE SET ready_at = EXCLUDED.ready_at,
        stopped_at = EXCLUDED.stopped_at, stop_reason = EXCLUDED.stop_reason,
        killed_inflight = EXCLUDED.killed_inflight
""")


async def write_intervals(engine: AsyncEngine, intervals: Iterable[Interval], epoch: datetime) -> int:
    """Upsert intervals (seconds relative to ``epoch``): a re-written open interval is closed,
    never doubled (the key is replica + start)."""
    def at(s: float | None) -> datetime | None:
        return None if s is None else epoch + timedelta(seconds=s)

    rows = [{"pool": iv.pool, "replica": iv.replica, "gpu": iv.gpu, "cost": iv.cost_per_hour_usd,
             "started": at(iv.started_s), "ready": at(iv.ready_s), "stopped": at(iv.stopped_s),
             "reason": iv.stop_reason, "killed": iv.killed_inflight} for iv in intervals]
    if rows:
        async with engine.begin() as conn:
            await conn.execute(_UPSERT, rows)
    return len(rows)


async def fleet_report(engine: AsyncEngine) -> dict[str, Any]:
    """The ``fleet_cost_per_successful_task`` view: provisioned, busy and idle GPU-hours,
    fleet cost, and fleet cost per successful task."""
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT * FROM fleet_cost_per_successful_task"))).mappings().one()
    return {k: (float(v) if v is not None and k != "tasks_succeeded" else v) for k, v in row.items()}


_WINDOW = text("""
    SELECT COUNT(*) AS intervals,
           COALESCE(SUM(EXTRACT(EPOCH FROM (LEAST(COALESCE(stopped_at, now()), :until)
                                            - GREATEST(started_at, :since)))), 0) / 3600.0 AS hours,
           COALESCE(SUM(EXTRACT(EPOCH FROM (LEAST(COALESCE(stopped_at, now()), :until)
                                            - GREATEST(started_at, :since))) * cost_per_hour_usd), 0) / 3600.0 AS cost
    FROM fleet_hours
    WHERE started_at < :until AND COALESCE(stopped_at, now()) > :since
""")


async def fleet_window(engine: AsyncEngine, since: datetime | None, until: datetime | None) -> tuple[int, float, float]:
    """(intervals, provisioned GPU-hours, fleet cost) inside the window, intervals clipped to it."""
    lo = since or datetime(1970, 1, 1, tzinfo=UTC)
    hi = until or datetime(9999, 1, 1, tzinfo=UTC)
    async with engine.connect() as conn:
        row = (await conn.execute(_WINDOW, {"since": lo, "until": hi})).one()
    return int(row[0]), float(row[1]), float(row[2])


_HISTORY = text("""
    WITH t AS (SELECT task_id, agent, EXTRACT(EPOCH FROM (finished_at - started_at)) AS secs FROM tasks
               WHERE status = 'succeeded' AND finished_at IS NOT NULL AND started_at > now() - interval '1 day'
                     AND parent_task_id IS NULL),
         c AS (SELECT task_id, COUNT(*) AS calls,
                      SUM(completion_tokens + CAST(:w AS double precision) * GREATEST(prompt_tokens - cached_tokens, 0)) AS work
               FROM llm_calls WHERE outcome = 'success' GROUP BY task_id)
    SELECT t.agent, COUNT(*) AS tasks, COALESCE(SUM(c.calls), 0) AS calls, COALESCE(SUM(c.work), 0) AS work,
           COALESCE(SUM(t.secs), 0) AS seconds
    FROM t LEFT JOIN c USING (task_id) GROUP BY t.agent
""")
_LIVE = text("""
    SELECT t.task_id, t.agent, EXTRACT(EPOCH FROM (t.deadline - now())) AS budget_s,
           COUNT(l.id) FILTER (WHERE l.outcome = 'success') AS calls_done,
           (ARRAY_AGG(l.replica ORDER BY l.started_at DESC) FILTER (WHERE l.replica IS NOT NULL))[1] AS replica,
           COALESCE(MAX(l.prompt_tokens + l.completion_tokens), 0) AS context_tokens
    FROM tasks t LEFT JOIN llm_calls l ON l.task_id = t.task_id
    WHERE t.status = 'running' AND t.started_at > now() - interval '1 day' AND t.parent_task_id IS NULL
    GROUP BY t.task_id, t.agent, t.deadline
""")


async def task_history(engine: AsyncEngine, *, prefill_weight: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(per-agent history of the last day's successful tasks: tasks, calls, work units,
    seconds; the workflows in flight: task, agent, budget, calls done, last replica, context)
    — the autoscaler's workflow signals, learned from Postgres. A work unit is a completion
    token plus ``prefill_weight`` per uncached prompt token (the autoscaler's ``PREFILL_WEIGHT``)."""
    async with engine.connect() as conn:
        hist = [dict(r) for r in (await conn.execute(_HISTORY, {"w": prefill_weight})).mappings().all()]
        live = [dict(r) for r in (await conn.execute(_LIVE)).mappings().all()]
    return hist, live
