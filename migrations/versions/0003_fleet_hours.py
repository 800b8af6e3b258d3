"""fleet_hours: one row per provisioned replica interval (idle included), and a fully loaded
cost view over it.

The autoscaler's fleet book writes a row when a replica is provisioned and closes it when the
replica stops; ``fleet_cost_per_successful_task`` charges every provisioned GPU-hour (busy
or idle) to the tasks that succeeded within their deadline. Definitions: docs/autoscale.md.

Revision ID: 0003_fleet_hours
Revises: 0002_report_views
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_fleet_hours"
down_revision: str | Sequence[str] | None = "0002_report_views"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fleet_hours",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("pool", sa.Text, nullable=False),
        sa.Column("replica", sa.Text, nullable=False),
        sa.Column("gpu", sa.Text, nullable=False),
        sa.Column("cost_per_hour_usd", sa.Float, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ready_at", sa.DateTime(timezone=True)),
        sa.Column("stopped_at", sa.DateTime(timezone=True)),
        sa.Column("stop_reason", sa.Text),
        sa.Column("killed_inflight", sa.Integer, nullable=False, server_default="0"),
        sa.UniqueConstraint("replica", "started_at", name="uq_fleet_hours_replica_start"),
    )
    op.create_index("ix_fleet_hours_started_at", "fleet_hours", ["started_at"])
    op.execute("""
        CREATE VIEW fleet_cost_per_successful_task AS
        WITH f AS (
            SELECT COALESCE(SUM(EXTRACT(EPOCH FROM (COALESCE(stopped_at, now()) - started_at))) / 3600.0, 0)
                       AS provisioned_gpu_hours,
                   COALESCE(SUM(EXTRACT(EPOCH FROM (COALESCE(stopped_at, now()) - started_at)) / 3600.0
                                * cost_per_hour_usd), 0) AS fleet_cost_usd
            FROM fleet_hours),
        b AS (SELECT COALESCE(SUM(gpu_seconds), 0) / 3600.0 AS busy_gpu_hours FROM llm_calls),
        t AS (SELECT COUNT(*) FILTER (WHERE status = 'succeeded' AND deadline_met IS NOT FALSE) AS tasks_succeeded
              FROM tasks)
        SELECT f.provisioned_gpu_hours, b.busy_gpu_hours,
               GREATEST(f.provisioned_gpu_hours - b.busy_gpu_hours, 0) AS idle_gpu_hours,
               f.fleet_cost_usd, t.tasks_succeeded,
               CASE WHEN t.tasks_succeeded > 0 THEN f.fleet_cost_usd / t.tasks_succeeded END
                   AS fleet_cost_per_successful_task_usd
        FROM f, b, t
    """)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS fleet_cost_per_successful_task")
    op.drop_index("ix_fleet_hours_started_at", table_name="fleet_hours")
    op.drop_table("fleet_hours")
