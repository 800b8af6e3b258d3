"""Task rows: what the ``task_record`` activity writes, and what the agent's history teaches.

With a database the row goes through the store's ``CostWriter`` (idempotent upsert by
task id; an outbox on disk rides out a short Postgres outage). Either way the worker
remembers how many LLM calls each agent's successful tasks made, so a task whose author
gave no estimate still sends a useful ``X-Taskplane-Steps-Remaining``.
"""

from __future__ import annotations

import inspect
import statistics
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import structlog

from taskplane.sdk.state import parse_time
from taskplane.sdk.types import TaskRowInput, TaskRowResult
from taskplane.store.records import TaskRecord, TaskStatus

log = structlog.get_logger("taskplane.worker")

HISTORY = 50  # successful tasks per agent the estimate looks at


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
    )


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class TaskRowStore:
    """Task rows through the store's CostWriter when a database is configured."""

    def __init__(self, database_url: str | None, outbox_dir: Path | None = None) -> None:
        self.database_url = database_url
        self.outbox_dir = outbox_dir
        self.history = StepHistory()
        self._writer: Any = None
        self._seeded: set[str] = set()

    def _get_writer(self) -> Any:
        if self._writer is None and self.database_url:
            from taskplane.store.writer import CostWriter

            outbox = self.outbox_dir or Path(".taskplane") / "outbox"
            self._writer = CostWriter(self.database_url, outbox)
        return self._writer

    async def record(self, row: TaskRowInput) -> TaskRowResult:
        writer = self._get_writer()
        if writer is not None:
            await _maybe_await(writer.upsert_task(to_record(row)))
            if row.status != "running":
                await _maybe_await(writer.flush())
        if row.status == "running":
            await self._seed(row.agent)
        elif row.status == "succeeded":
            self.history.learn(row.agent, row.llm_calls)
        log.info("task_row", task_id=row.task_id, status=row.status, cost_usd=round(row.cost_usd, 8))
        return TaskRowResult(cost_usd=row.cost_usd, learned_steps=self.history.estimate(row.agent))

    async def _seed(self, agent: str) -> None:
        """Once per agent per worker: learn from the agent's past tasks in Postgres."""
        if agent in self._seeded or not self.database_url:
            return
        self._seeded.add(agent)
        try:
            import importlib

            repo = importlib.import_module("taskplane.store.repo")
            fn = getattr(repo, "llm_calls_per_successful_task", None)
            if fn is None:
                return
            counts = await _maybe_await(fn(self.database_url, agent, limit=HISTORY))
            self.history.seed(agent, [int(c) for c in counts])
        except Exception as exc:  # learning is a bonus; never fail a task for it
            log.warning("step_history_unavailable", agent=agent, error=str(exc))

    async def close(self) -> None:
        if self._writer is not None:
            await _maybe_await(self._writer.close())
            self._writer = None
