"""Read-side queries over the cost tables (async, one engine passed in).

The gateway asks what a task has spent so far (for the sunk-cost axis), the workflows
what to put in the task row, the reports which rows fall in a window, and the cost
model which price applies to a GPU at a moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, func, insert, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from taskplane.store.models import LlmCall, Price, Task
from taskplane.store.pricing import PriceEntry
from taskplane.store.records import AttemptRecord, Outcome, TaskRecord, TaskStatus
from taskplane.store.upserts import task_row

_ATTEMPT_FIELDS = tuple(AttemptRecord.model_fields)
_TASK_FIELDS = tuple(TaskRecord.model_fields)
_PRICE_LOCK = 0x7470707269636573  # serialises concurrent price-book publishers
_FAILED_OUTCOMES = (Outcome.ERROR.value, Outcome.TIMEOUT.value, Outcome.CANCELLED.value)


@dataclass(frozen=True, slots=True)
class TaskSpend:
    """What a task has cost so far, from its attempt rows."""

    task_id: str
    cost_usd: float
    attempts: int  # every attempt row, whatever its outcome
    failed_attempts: int  # error, timeout or cancelled: the ones a retry had to redo
    gpu_seconds: float


def _attempt(row: Any) -> AttemptRecord:
    return AttemptRecord.model_validate({f: getattr(row, f) for f in _ATTEMPT_FIELDS})


def _task(row: Any) -> TaskRecord:
    return TaskRecord.model_validate({f: getattr(row, f) for f in _TASK_FIELDS})


def _price(row: Any) -> PriceEntry:
    return PriceEntry(
        gpu=row.gpu,
        cost_per_hour_usd=row.cost_per_hour_usd,
        usd_per_prompt_token=row.usd_per_prompt_token,
        usd_per_cached_token=row.usd_per_cached_token,
        usd_per_completion_token=row.usd_per_completion_token,
        version=row.version,
        valid_from=row.valid_from,
    )


async def task_spend(engine: AsyncEngine, task_id: str) -> TaskSpend:
    """Cost and attempts of ``task_id`` so far (zeros for an unknown task)."""
    q = select(
        func.coalesce(func.sum(LlmCall.cost_usd), 0.0),
        func.count(),
        func.count().filter(LlmCall.outcome.in_(_FAILED_OUTCOMES)),
        func.coalesce(func.sum(LlmCall.gpu_seconds), 0.0),
    ).where(LlmCall.task_id == task_id)
    async with engine.connect() as conn:
        cost, attempts, failed, gpu_s = (await conn.execute(q)).one()
    return TaskSpend(task_id, float(cost), int(attempts), int(failed), float(gpu_s))


async def get_task(engine: AsyncEngine, task_id: str) -> TaskRecord | None:
    """The task row, or None."""
    async with engine.connect() as conn:
        row = (await conn.execute(select(Task).where(Task.task_id == task_id))).first()
    return _task(row) if row is not None else None


async def close_unrun_task(engine: AsyncEngine, rec: TaskRecord) -> bool:
    """Write the final row of a task no worker ran (its agent was not served, it timed out):
    inserted when absent, or closing a ``running`` row; a row some worker finished stays as
    it is. True when this call wrote it."""
    row = task_row(rec)
    stmt = pg_insert(Task).values(row)
    tasks = Task.__table__.c
    keep = {"task_id", "started_at", "parent_task_id", "root_task_id"}
    stmt = stmt.on_conflict_do_update(
        index_elements=[tasks.task_id],
        set_={k: getattr(stmt.excluded, k) for k in row if k not in keep} | {"updated_at": func.now()},
        where=tasks.status == TaskStatus.RUNNING.value,
    )
    async with engine.begin() as conn:
        return bool((await conn.execute(stmt)).rowcount)


async def task_attempts(engine: AsyncEngine, task_id: str) -> list[AttemptRecord]:
    """Every attempt of a task, oldest first."""
    q = select(LlmCall).where(LlmCall.task_id == task_id).order_by(LlmCall.started_at, LlmCall.id)
    async with engine.connect() as conn:
        return [_attempt(r) for r in (await conn.execute(q)).all()]


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


async def report_rows(
    engine: AsyncEngine,
    since: datetime | None = None,
    until: datetime | None = None,
    tenant: str | None = None,
) -> tuple[list[AttemptRecord], list[TaskRecord]]:
    """The rows a report over ``[since, until)`` needs, optionally for one tenant.

    Attempts: those started in the window. Tasks: those that ended (or, still running,
    started) in the window, plus the tasks of those attempts and the goals of those
    tasks, so every attempt's goal status is known even when it ended outside the window.
    """
    since, until = _utc(since), _utc(until)
    call_cond = []
    if since is not None:
        call_cond.append(LlmCall.started_at >= since)
    if until is not None:
        call_cond.append(LlmCall.started_at < until)
    if tenant is not None:
        call_cond.append(LlmCall.tenant == tenant)
    task_time = func.coalesce(Task.finished_at, Task.started_at)
    task_window = []
    if since is not None:
        task_window.append(task_time >= since)
    if until is not None:
        task_window.append(task_time < until)
    call_tasks = select(LlmCall.task_id).where(and_(True, *call_cond), LlmCall.task_id.is_not(None)).distinct()
    # the goals of the window's sub-agent tasks too, so their calls roll up even when the goal ended elsewhen
    goals = select(Task.root_task_id).where(Task.task_id.in_(call_tasks) | and_(True, *task_window),
                                            Task.root_task_id.is_not(None))
    task_cond: list[Any] = [or_(and_(True, *task_window), Task.task_id.in_(call_tasks), Task.task_id.in_(goals))]
    if tenant is not None:
        task_cond.append(Task.tenant == tenant)
    async with engine.connect() as conn:
        calls = (await conn.execute(select(LlmCall).where(and_(True, *call_cond)).order_by(LlmCall.started_at, LlmCall.id))).all()
        tasks = (await conn.execute(select(Task).where(*task_cond).order_by(Task.started_at))).all()
    return [_attempt(r) for r in calls], [_task(r) for r in tasks]


async def price_for(engine: AsyncEngine, gpu: str, at: datetime | None = None) -> PriceEntry | None:
    """The price of ``gpu`` in force at ``at`` (default now): the newest version valid by then
    that lists this GPU; None when the book has no line for it."""
    at = _utc(at) or datetime.now(UTC)
    q = (
        select(Price)
        .where(Price.gpu == gpu, Price.valid_from <= at)
        .order_by(Price.version.desc())
        .limit(1)
    )
    async with engine.connect() as conn:
        row = (await conn.execute(q)).first()
    return _price(row) if row is not None else None


async def price_book(engine: AsyncEngine, version: int | None = None) -> list[PriceEntry]:
    """Every line of one price-book version (default: the newest version)."""
    async with engine.connect() as conn:
        if version is None:
            version = (await conn.execute(select(func.max(Price.version)))).scalar()
            if version is None:
                return []
        rows = (await conn.execute(select(Price).where(Price.version == version).order_by(Price.gpu))).all()
    return [_price(r) for r in rows]


async def add_price_version(
    engine: AsyncEngine,
    entries: list[PriceEntry],
    valid_from: datetime | None = None,
    note: str | None = None,
) -> int:
    """Publish a new price-book version (old versions stay, so old rows stay explainable)."""
    valid_from = _utc(valid_from) or datetime.now(UTC)
    async with engine.begin() as conn:
        await conn.execute(select(func.pg_advisory_xact_lock(_PRICE_LOCK)))
        current = (await conn.execute(select(func.coalesce(func.max(Price.version), 0)))).scalar_one()
        version = int(current) + 1
        await conn.execute(
            insert(Price),
            [
                {
                    "version": version,
                    "gpu": e.gpu,
                    "cost_per_hour_usd": e.cost_per_hour_usd,
                    "usd_per_prompt_token": e.usd_per_prompt_token,
                    "usd_per_cached_token": e.usd_per_cached_token,
                    "usd_per_completion_token": e.usd_per_completion_token,
                    "valid_from": valid_from,
                    "note": note,
                }
                for e in entries
            ],
        )
    return version
