"""The Postgres schema as SQLAlchemy 2 models: tasks, llm_calls (one row per attempt), prices.

Migrations in ``migrations/versions`` create exactly these tables; the models are what
the writer and the repository query against. Columns mirror ``records.AttemptRecord``
and ``records.TaskRecord`` one to one so rows and records convert without loss.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from taskplane.store.records import Outcome, TaskStatus

TASK_STATUSES = tuple(s.value for s in TaskStatus)
OUTCOMES = tuple(o.value for o in Outcome)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    pass


class Task(Base):
    """One agent task (a Temporal workflow). Upserted at start and at end."""

    __tablename__ = "tasks"

    task_id: Mapped[str] = mapped_column(Text, primary_key=True)
    agent: Mapped[str] = mapped_column(Text)
    tenant: Mapped[str] = mapped_column(Text, default="default")
    priority: Mapped[str] = mapped_column(Text, default="standard")
    status: Mapped[str] = mapped_column(String(32), default="running")
    deadline: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    deadline_met: Mapped[bool | None] = mapped_column(Boolean)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    retries: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # a sub-agent's task: who started it, and the goal at the top of its tree (NULL for a goal)
    parent_task_id: Mapped[str | None] = mapped_column(Text)
    root_task_id: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        CheckConstraint(_in("status", TASK_STATUSES), name="tasks_status_valid"),
        Index("ix_tasks_root_task_id", "root_task_id"),
        Index("ix_tasks_tenant", "tenant"),
        Index("ix_tasks_started_at", "started_at"),
        Index("ix_tasks_finished_at", "finished_at"),
    )


class LlmCall(Base):
    """One LLM call attempt, whatever its outcome. ``attempt_key`` makes writes idempotent."""

    __tablename__ = "llm_calls"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    attempt_key: Mapped[str] = mapped_column(Text, unique=True)
    task_id: Mapped[str | None] = mapped_column(Text)
    step: Mapped[int | None] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    session_id: Mapped[str | None] = mapped_column(Text)
    tenant: Mapped[str] = mapped_column(Text, default="default")
    agent: Mapped[str | None] = mapped_column(Text)
    model_requested: Mapped[str] = mapped_column(Text)
    adapter: Mapped[str | None] = mapped_column(Text)  # the LoRA adapter on model_requested; NULL: the base model
    model_served: Mapped[str | None] = mapped_column(Text)
    replica: Mapped[str | None] = mapped_column(Text)
    prefill_replica: Mapped[str | None] = mapped_column(Text)  # disaggregated: where the prompt was computed
    gpu: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    queue_ms: Mapped[float] = mapped_column(Float, default=0.0)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    total_ms: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    price_version: Mapped[int | None] = mapped_column(Integer)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    outcome: Mapped[str] = mapped_column(String(32), default="success")
    error_type: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (
        CheckConstraint(_in("outcome", OUTCOMES), name="llm_calls_outcome_valid"),
        Index("ix_llm_calls_task_id", "task_id"),
        Index("ix_llm_calls_started_at", "started_at"),
        Index("ix_llm_calls_tenant", "tenant"),
    )


class Price(Base):
    """One line of the versioned price book: a GPU generation (or an external API pool)."""

    __tablename__ = "prices"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version: Mapped[int] = mapped_column(Integer)
    gpu: Mapped[str] = mapped_column(Text)
    cost_per_hour_usd: Mapped[float] = mapped_column(Float, default=0.0)
    usd_per_prompt_token: Mapped[float | None] = mapped_column(Float)
    usd_per_cached_token: Mapped[float | None] = mapped_column(Float)
    usd_per_completion_token: Mapped[float | None] = mapped_column(Float)
    valid_from: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    note: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        UniqueConstraint("version", "gpu", name="prices_version_gpu_key"),
        Index("ix_prices_gpu_valid_from", "gpu", "valid_from"),
    )
