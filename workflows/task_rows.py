"""Task rows: what the ``task_record`` activity writes, and what the agent's history teaches.

With a database the row goes through the store's ``CostWriter`` (idempotent upsert by
task id; an outbox on disk rides out a short Postgres outage). Either way the worker
remembers how many LLM calls each agent's successful tasks made, so a task whose author
gave no estimate still sends a useful ``X-Taskplane-Steps-Remaining``.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import structlog

from taskplane.errors import UserError
from taskplane.sdk.state import parse_time
from taskplane.sdk.types import TaskRowInput, TaskRowResult
from taskplane.store.records import TaskRecord, TaskStatus

log = structlog.get_logger("taskplane.worker")

HISTORY = 50  # successful tasks per agent the estimate looks at
SETTLE_S = 3.0  # how long the final row waits for the gateway's attempt rows to land


class StepHistory:
    """LLM calls per successful task, per agent (median of the recent ones)."""

    def __init__(self) -> None:
        self._calls: dict[str, deque[int]] = defaultdict(lambda: deque(maxlen=HISTORY))

    def learn(self, agent: str, llm_calls: int) -> None:
        if llm_calls > 0:
            self._calls[agent].append(llm_calls)

    def estimate(self, agent: str) -> int | None:
        seen = self._calls.get(agent)
        return round(statistics.median(seen)) if seen else None

    def seed(self, agent: str, counts: list[int]) -> None:
        for n in counts:
            self.learn(agent, n)


def to_record(row: TaskRowInput) -> TaskRecord:
    started = parse_time(row.started_at)
    assert started is not None
    return TaskRecord(
        task_id=row.task_id, agent=row.agent, tenant=row.tenant, priority=row.priority,
        status=TaskStatus(row.status), deadline=parse_time(row.deadline), deadline_met=row.deadline_met,
        started_at=started, finished_at=parse_time(row.finished_at), cost_usd=row.cost_usd,
        attempts=row.attempts, retries=row.retries, error=(row.error or None) and row.error[:2000],
        parent_task_id=row.parent_task_id, root_task_id=row.root_task_id or row.parent_task_id,
    )


class TaskRowStore:
    """Task rows through the store's CostWriter when a database is configured.

    A sub-agent's row names its parent and its goal (``parent_task_id``, ``root_task_id``):
    the goal's row carries the whole tree's cost, attempts and retries, and reports count
    goals (one user goal, one task) unless asked to count sub-agents as tasks too.
    """

    def __init__(self, database_url: str | None, outbox_dir: Path | None = None,
                 settle_s: float = SETTLE_S) -> None:
        self.database_url = database_url
        self.outbox_dir = outbox_dir
        self.settle_s = settle_s
        self.history = StepHistory()
        self._writer: Any = None
        self._engine: Any = None
        self._seeded: set[str] = set()
        self._lock = asyncio.Lock()

    async def _get_writer(self) -> Any:
        async with self._lock:
            if self._writer is None and self.database_url:
                from taskplane.store.db import create_engine
                from taskplane.store.writer import CostWriter

                outbox = self.outbox_dir or Path(".taskplane") / "outbox" / "worker"
                writer = CostWriter(self.database_url, outbox)
                try:
                    await writer.start()
                except UserError:
                    # another worker owns that outbox: use one of our own (a restarted worker
                    # still replays the shared one, which is what survives a crash)
                    writer = CostWriter(self.database_url, outbox.parent / f"{outbox.name}-{os.getpid()}")
                    await writer.start()
                self._writer = writer
                self._engine = create_engine(self.database_url, pool_size=2)
            return self._writer

    async def record(self, row: TaskRowInput) -> TaskRowResult:
        result = TaskRowResult(cost_usd=row.cost_usd)
        writer = await self._get_writer()
        if writer is not None and row.status != "running":
            result = await self._spend(row)
            row.cost_usd, row.attempts, row.retries = result.cost_usd, result.attempts or 0, result.retries or 0
        # the sub-agents' attempts and retries roll up into the goal's row (their cost already does)
        row.attempts += row.child_attempts
        row.retries += max(row.child_attempts - row.child_llm_calls, 0)
        result.attempts, result.retries = row.attempts, row.retries
        if writer is not None:
            await writer.upsert_task(to_record(row))
            if row.status != "running":
                await writer.flush(5.0)
        if row.status == "running":
            await self._seed(row.agent)
        elif row.status == "succeeded":
            self.history.learn(row.agent, row.llm_calls)
        log.info("task_row", task_id=row.task_id, status=row.status, cost_usd=round(row.cost_usd, 8),
                 sub_agent=bool(row.parent_task_id))
        result.learned_steps = self.history.estimate(row.agent)
        return result

    async def _spend(self, row: TaskRowInput) -> TaskRowResult:
        """Cost and attempts from the gateway's ``llm_calls`` rows (failed attempts included).

        The gateway writes rows asynchronously, so wait briefly until every call the task
        made is there; the header sum stays the floor if rows are late.
        """
        from taskplane.store import repo

        own_header = max(row.cost_usd - row.child_cost_usd, 0.0)
        deadline = time.monotonic() + self.settle_s
        spend = None
        settled = False
        while True:
            try:
                spend = await repo.task_spend(self._engine, row.task_id)
            except Exception as exc:  # the DB being down must not hold the task up
                log.warning("task_spend_unavailable", task_id=row.task_id, error=str(exc))
                break
            settled = spend.attempts - spend.failed_attempts >= row.llm_calls
            if settled or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.1)
        if spend is None:
            return TaskRowResult(cost_usd=row.cost_usd, attempts=row.attempts, retries=row.retries)
        # Settled: the rows are the truth (full precision, failed attempts included).
        own = spend.cost_usd if settled else max(spend.cost_usd, own_header)
        return TaskRowResult(
            cost_usd=own + row.child_cost_usd,
            attempts=max(spend.attempts, row.attempts),
            retries=max(spend.failed_attempts, row.retries),
        )

    async def _seed(self, agent: str) -> None:
        """Once per agent per worker: learn from the agent's past tasks in Postgres."""
        if agent in self._seeded or self._engine is None:
            return
        self._seeded.add(agent)
        try:
            from sqlalchemy import text

            q = text(
                "SELECT count(DISTINCT c.step) FROM tasks t JOIN llm_calls c ON c.task_id = t.task_id "
                "WHERE t.agent = :agent AND t.status = 'succeeded' "
                "GROUP BY t.task_id, t.finished_at ORDER BY t.finished_at DESC LIMIT :n"
            )
            async with self._engine.connect() as conn:
                counts = [int(r[0]) for r in (await conn.execute(q, {"agent": agent, "n": HISTORY})).all()]
            self.history.seed(agent, list(reversed(counts)))
        except Exception as exc:  # learning is a bonus; never fail a task for it
            log.warning("step_history_unavailable", agent=agent, error=str(exc))

    async def close(self) -> None:
        if self._writer is not None:
            await self._writer.close()
            self._writer = None
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None
