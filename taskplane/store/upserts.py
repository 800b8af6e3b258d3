"""The idempotent Postgres writes of cost records.

Attempts go in with ``INSERT ... ON CONFLICT (attempt_key) DO NOTHING``, tasks with an
upsert that never turns a terminal status back into ``running``: a row delivered twice
(a replay after a crash, a retried activity) changes nothing the second time.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, or_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from taskplane.store.db import sqlstate
from taskplane.store.models import LlmCall, Task
from taskplane.store.records import AttemptRecord, TaskRecord, TaskStatus


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _clean(value: Any) -> Any:
    """Postgres text cannot hold NUL; strip it rather than reject the row."""
    return value.replace("\x00", "") if isinstance(value, str) else value


def attempt_row(rec: AttemptRecord) -> dict[str, Any]:
    """The ``llm_calls`` row of an attempt record."""
    row = {k: _clean(v) for k, v in rec.model_dump().items()}
    row["outcome"] = str(rec.outcome.value)
    row["started_at"] = _utc(rec.started_at)
    return row


def task_row(rec: TaskRecord) -> dict[str, Any]:
    """The ``tasks`` row of a task record."""
    row = {k: _clean(v) for k, v in rec.model_dump().items()}
    row["status"] = str(rec.status.value)
    for key in ("deadline", "started_at", "finished_at"):
        row[key] = _utc(row[key])
    return row


def merge_task(old: TaskRecord, new: TaskRecord) -> TaskRecord:
    """The task record after ``new`` is written over ``old`` (same rule as the SQL upsert).

    Last writer wins, except that a terminal status is never replaced by ``running``;
    the earliest start is kept and a missing deadline / finish time does not erase one.
    """
    if old.status is not TaskStatus.RUNNING and new.status is TaskStatus.RUNNING:
        return old
    started = min(_utc(old.started_at), _utc(new.started_at))  # type: ignore[type-var]
    return new.model_copy(
        update={
            "started_at": started,
            "deadline": new.deadline if new.deadline is not None else old.deadline,
            "deadline_met": new.deadline_met if new.deadline_met is not None else old.deadline_met,
            "finished_at": new.finished_at if new.finished_at is not None else old.finished_at,
            "parent_task_id": new.parent_task_id or old.parent_task_id,
            "root_task_id": new.root_task_id or old.root_task_id,
        }
    )


def _task_upsert() -> Any:
    stmt = pg_insert(Task)
    ex = stmt.excluded
    tasks = Task.__table__.c
    return stmt.on_conflict_do_update(
        index_elements=[tasks.task_id],
        set_={
            "agent": ex.agent,
            "tenant": ex.tenant,
            "priority": ex.priority,
            "status": ex.status,
            "deadline": func.coalesce(ex.deadline, tasks.deadline),
            "deadline_met": func.coalesce(ex.deadline_met, tasks.deadline_met),
            "started_at": func.least(tasks.started_at, ex.started_at),
            "finished_at": func.coalesce(ex.finished_at, tasks.finished_at),
            "cost_usd": ex.cost_usd,
            "attempts": ex.attempts,
            "retries": ex.retries,
            "error": ex.error,
            "parent_task_id": func.coalesce(ex.parent_task_id, tasks.parent_task_id),
            "root_task_id": func.coalesce(ex.root_task_id, tasks.root_task_id),
            "updated_at": func.now(),
        },
        where=or_(tasks.status == TaskStatus.RUNNING.value, ex.status != TaskStatus.RUNNING.value),
    )


async def write_records(
    engine: AsyncEngine, attempts: Iterable[AttemptRecord], tasks: Iterable[TaskRecord]
) -> None:
    """Write records straight to Postgres in one transaction, idempotently (no outbox)."""
    merged: dict[str, TaskRecord] = {}
    for t in tasks:
        merged[t.task_id] = merge_task(merged[t.task_id], t) if t.task_id in merged else t
    attempt_rows: dict[str, dict[str, Any]] = {}
    for a in attempts:  # the first row of a key wins, as ON CONFLICT DO NOTHING does across batches
        attempt_rows.setdefault(a.attempt_key, attempt_row(a))
    async with engine.begin() as conn:
        if attempt_rows:
            stmt = pg_insert(LlmCall).on_conflict_do_nothing(index_elements=["attempt_key"])
            await conn.execute(stmt, list(attempt_rows.values()))
        if merged:
            await conn.execute(_task_upsert(), [task_row(t) for t in merged.values()])


def is_bad_data(exc: BaseException) -> bool:
    """Postgres rejected the values themselves (SQLSTATE class 22 data, 23 constraint)."""
    state = sqlstate(exc)
    return state is not None and state[:2] in {"22", "23"}
