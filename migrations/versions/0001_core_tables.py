"""Core tables: tasks, llm_calls (one row per attempt), prices (versioned price book).

Revision ID: 0001_core_tables
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0001_core_tables"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)

#: Price book version 1: on-demand cloud list prices per GPU, USD per GPU-hour (2025).
SEED_PRICES = [
    ("h100", 2.50),
    ("h200", 3.50),
    ("b200", 5.50),
    ("a100", 1.60),
    ("l40s", 1.00),
    ("cpu", 0.10),
]


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("task_id", sa.Text, primary_key=True),
        sa.Column("agent", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False, server_default="default"),
        sa.Column("priority", sa.Text, nullable=False, server_default="standard"),
        sa.Column("status", sa.String(32), nullable=False, server_default="running"),
        sa.Column("deadline", TS),
        sa.Column("deadline_met", sa.Boolean),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS),
        sa.Column("cost_usd", sa.Float, nullable=False, server_default="0"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("retries", sa.Integer, nullable=False, server_default="0"),
        sa.Column("error", sa.Text),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint(
            "status IN ('running', 'succeeded', 'failed', 'failed-deadline', 'cancelled')",
            name="tasks_status_valid",
        ),
    )
    op.create_index("ix_tasks_tenant", "tasks", ["tenant"])
    op.create_index("ix_tasks_started_at", "tasks", ["started_at"])
    op.create_index("ix_tasks_finished_at", "tasks", ["finished_at"])

    op.create_table(
        "llm_calls",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("attempt_key", sa.Text, nullable=False, unique=True),
        sa.Column("task_id", sa.Text),
        sa.Column("step", sa.Integer),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="1"),
        sa.Column("session_id", sa.Text),
        sa.Column("tenant", sa.Text, nullable=False, server_default="default"),
        sa.Column("agent", sa.Text),
        sa.Column("model_requested", sa.Text, nullable=False),
        sa.Column("model_served", sa.Text),
        sa.Column("replica", sa.Text),
        sa.Column("gpu", sa.Text),
        sa.Column("prompt_tokens", sa.Integer, nullable=False, server_default="0"),
        sa.Column("cached_tokens", sa.Integer, nullable=False, server_default="0"),
        sa.Column("completion_tokens", sa.Integer, nullable=False, server_default="0"),
        sa.Column("queue_ms", sa.Float, nullable=False, server_default="0"),
        sa.Column("ttft_ms", sa.Float),
        sa.Column("total_ms", sa.Float, nullable=False, server_default="0"),
        sa.Column("gpu_seconds", sa.Float, nullable=False, server_default="0"),
        sa.Column("price_version", sa.Integer),
        sa.Column("cost_usd", sa.Float, nullable=False, server_default="0"),
        sa.Column("outcome", sa.String(32), nullable=False, server_default="success"),
        sa.Column("error_type", sa.Text),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("recorded_at", TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint(
            "outcome IN ('success', 'error', 'timeout', 'cancelled', 'shed', 'cached')",
            name="llm_calls_outcome_valid",
        ),
    )
    op.create_index("ix_llm_calls_task_id", "llm_calls", ["task_id"])
    op.create_index("ix_llm_calls_started_at", "llm_calls", ["started_at"])
    op.create_index("ix_llm_calls_tenant", "llm_calls", ["tenant"])

    prices = op.create_table(
        "prices",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("gpu", sa.Text, nullable=False),
        sa.Column("cost_per_hour_usd", sa.Float, nullable=False, server_default="0"),
        sa.Column("usd_per_prompt_token", sa.Float),
        sa.Column("usd_per_cached_token", sa.Float),
        sa.Column("usd_per_completion_token", sa.Float),
        sa.Column("valid_from", TS, nullable=False, server_default=sa.func.now()),
        sa.Column("note", sa.Text),
        sa.UniqueConstraint("version", "gpu", name="prices_version_gpu_key"),
    )
    op.create_index("ix_prices_gpu_valid_from", "prices", ["gpu", "valid_from"])
    op.bulk_insert(
        prices,
        [
            {
                "version": 1,
                "gpu": gpu,
                "cost_per_hour_usd": usd,
                "valid_from": datetime(1970, 1, 1, tzinfo=UTC),
                "note": "seed: on-demand list price per GPU-hour",
            }
            for gpu, usd in SEED_PRICES
        ],
        multiinsert=False,
    )


def downgrade() -> None:
    op.drop_table("prices")
    op.drop_table("llm_calls")
    op.drop_table("tasks")
