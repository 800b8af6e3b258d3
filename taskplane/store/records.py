"""Plain records of what happened: one per LLM call attempt and one per task.

The gateway, the workflows and the cluster simulator all produce these, so one report
code reads both live Postgres rows and simulated runs.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field


class Outcome(StrEnum):
    SUCCESS = "success"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    SHED = "shed"
    CACHED = "cached"  # served from the exact response cache; no GPU time


#: ``error_type`` of an attempt whose gateway was killed while a replica worked on it; its
#: row is written by the next gateway on the same outbox, with an estimated cost.
GATEWAY_LOST = "gateway_lost"


class Stored(StrEnum):
    """Where a cost writer put a row."""

    OUTBOX = "outbox"  # the durable local outbox (the normal path)
    DIRECT = "postgres"  # straight to Postgres: the outbox could not take it (disk full?)


class RowNotStored(Exception):
    """Neither the outbox nor Postgres took a row: the caller must not serve unbilled calls."""


class TaskStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    FAILED_DEADLINE = "failed-deadline"
    CANCELLED = "cancelled"


class AttemptRecord(BaseModel):
    """One LLM call attempt. ``attempt_key`` is unique: writing it twice is a no-op."""

    attempt_key: str = Field(description="call id + gateway try; the idempotency key")
    task_id: str | None = None
    step: int | None = None
    attempt: int = 1
    session_id: str | None = None
    tenant: str = "default"
    agent: str | None = None
    model_requested: str
    # the LoRA adapter the attempt ran with on ``model_requested`` (None: the base model);
    # rows written before adapters load as None
    adapter: str | None = None
    model_served: str | None = None
    replica: str | None = None
    # disaggregated: the replica that computed the prompt (``replica`` decoded it); its share
    # of that GPU is in ``gpu_seconds`` and ``cost_usd``. None: aggregated, and rows from before
    prefill_replica: str | None = None
    gpu: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    queue_ms: float = 0.0
    ttft_ms: float | None = None
    total_ms: float = 0.0
    gpu_seconds: float = 0.0
    price_version: int | None = None
    cost_usd: float = 0.0
    outcome: Outcome = Outcome.SUCCESS
    error_type: str | None = None
    started_at: datetime


class TaskRecord(BaseModel):
    """One agent task (a Temporal workflow). Upserted at start and at end.

    A sub-agent's task has a record too, with ``parent_task_id`` (the task that started it)
    and ``root_task_id`` (the user's goal at the top of the tree); a goal has neither.
    Reports count goals and roll every call of the tree up into the goal's agent, unless
    asked to count sub-agents as tasks of their own.
    """

    task_id: str
    agent: str
    tenant: str = "default"
    priority: str = "standard"
    status: TaskStatus = TaskStatus.RUNNING
    deadline: datetime | None = None
    deadline_met: bool | None = None
    started_at: datetime
    finished_at: datetime | None = None
    cost_usd: float = 0.0
    attempts: int = 0
    retries: int = 0
    error: str | None = None
    parent_task_id: str | None = None
    root_task_id: str | None = None
