"""Running totals the report adds records into, and the small time helpers it shares."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

from taskplane.store.records import AttemptRecord, Outcome, TaskRecord, TaskStatus


class TaskCounts(BaseModel):
    tasks_total: int = 0
    tasks_succeeded: int = Field(default=0, description="succeeded within the deadline: the headline's divisor")
    tasks_succeeded_late: int = Field(default=0, description="status succeeded but the deadline was missed")
    tasks_failed: int = Field(default=0, description="failed or failed-deadline")
    tasks_cancelled: int = 0
    tasks_running: int = 0

    def add(self, task: TaskRecord) -> None:
        self.tasks_total += 1
        if task.status is TaskStatus.SUCCEEDED:
            if task.deadline_met is False:
                self.tasks_succeeded_late += 1
            else:
                self.tasks_succeeded += 1
        elif task.status in (TaskStatus.FAILED, TaskStatus.FAILED_DEADLINE):
            self.tasks_failed += 1
        elif task.status is TaskStatus.CANCELLED:
            self.tasks_cancelled += 1
        else:
            self.tasks_running += 1


class Spend(BaseModel):
    calls: int = 0
    total_cost_usd: float = 0.0
    gpu_seconds: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    served_prompt_tokens: int = Field(default=0, description="prompt tokens of successful calls")
    served_cached_tokens: int = Field(default=0, description="cached tokens of successful calls")

    def add(self, a: AttemptRecord) -> None:
        self.calls += 1
        self.total_cost_usd += a.cost_usd
        self.gpu_seconds += a.gpu_seconds
        self.prompt_tokens += a.prompt_tokens
        self.cached_tokens += a.cached_tokens
        self.completion_tokens += a.completion_tokens
        if a.outcome is Outcome.SUCCESS:
            self.served_prompt_tokens += a.prompt_tokens
            self.served_cached_tokens += a.cached_tokens

    @property
    def cache_hit_ratio(self) -> float | None:
        return ratio(self.served_cached_tokens, self.served_prompt_tokens)


def ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def task_time(task: TaskRecord) -> datetime:
    """When a task counts: when it ended, or when it started if it still runs."""
    return utc(task.finished_at or task.started_at)  # type: ignore[return-value]
