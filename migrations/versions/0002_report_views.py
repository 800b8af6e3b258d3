"""SQL views for analysts: cost per successful task (overall, by agent, tenant, day) and waste.

They compute the same numbers as ``taskplane report`` (taskplane/reports/compute.py)
over all rows; a test checks that they agree. Definitions are in docs/costs.md.

Revision ID: 0002_report_views
Revises: 0001_core_tables
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002_report_views"
down_revision: str | Sequence[str] | None = "0001_core_tables"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SUCCESSFUL = "status = 'succeeded' AND deadline_met IS NOT FALSE"
FAILED = "status IN ('failed', 'failed-deadline')"

TASK_COUNTS = f"""
    COUNT(*) AS tasks_total,
    COUNT(*) FILTER (WHERE {SUCCESSFUL}) AS tasks_succeeded,
    COUNT(*) FILTER (WHERE status = 'succeeded' AND deadline_met IS FALSE) AS tasks_succeeded_late,
    COUNT(*) FILTER (WHERE {FAILED}) AS tasks_failed,
    COUNT(*) FILTER (WHERE status = 'cancelled') AS tasks_cancelled,
    COUNT(*) FILTER (WHERE status = 'running') AS tasks_running
"""

SPEND = """
    COUNT(*) AS calls,
    COALESCE(SUM(l.cost_usd), 0) AS total_cost_usd,
    COALESCE(SUM(l.gpu_seconds), 0) AS gpu_seconds,
    COALESCE(SUM(l.prompt_tokens), 0) AS prompt_tokens,
    COALESCE(SUM(l.completion_tokens), 0) AS completion_tokens,
    COALESCE(SUM(l.prompt_tokens) FILTER (WHERE l.outcome = 'success'), 0) AS served_prompt_tokens,
    COALESCE(SUM(l.cached_tokens) FILTER (WHERE l.outcome = 'success'), 0) AS served_cached_tokens
"""

RATIOS = """
    s.total_cost_usd / NULLIF(t.tasks_succeeded, 0) AS cost_per_successful_task_usd,
    s.total_cost_usd / NULLIF(s.prompt_tokens + s.completion_tokens, 0) AS cost_per_token_usd,
    s.total_cost_usd / NULLIF(s.calls, 0) AS cost_per_request_usd,
    s.served_cached_tokens::double precision / NULLIF(s.served_prompt_tokens, 0) AS cache_hit_ratio
"""

OVERALL = f"""
CREATE VIEW cost_per_successful_task AS
WITH s AS (SELECT {SPEND} FROM llm_calls l),
     t AS (SELECT {TASK_COUNTS} FROM tasks)
SELECT t.tasks_total, t.tasks_succeeded, t.tasks_succeeded_late, t.tasks_failed,
       t.tasks_cancelled, t.tasks_running,
       s.calls, s.total_cost_usd, s.gpu_seconds, s.prompt_tokens, s.completion_tokens,
       {RATIOS}
FROM s CROSS JOIN t
"""


def grouped(name: str, key: str, spend_key: str, task_key: str) -> str:
    """A view with one row per key: spend from llm_calls, task counts from tasks."""
    return f"""
CREATE VIEW {name} AS
WITH s AS (
    SELECT {spend_key} AS k, {SPEND}
    FROM llm_calls l LEFT JOIN tasks tk ON tk.task_id = l.task_id
    GROUP BY 1
),
t AS (SELECT {task_key} AS k, {TASK_COUNTS} FROM tasks GROUP BY 1)
SELECT COALESCE(s.k, t.k) AS {key},
       COALESCE(t.tasks_total, 0) AS tasks_total,
       COALESCE(t.tasks_succeeded, 0) AS tasks_succeeded,
       COALESCE(t.tasks_succeeded_late, 0) AS tasks_succeeded_late,
       COALESCE(t.tasks_failed, 0) AS tasks_failed,
       COALESCE(t.tasks_cancelled, 0) AS tasks_cancelled,
       COALESCE(t.tasks_running, 0) AS tasks_running,
       COALESCE(s.calls, 0) AS calls,
       COALESCE(s.total_cost_usd, 0) AS total_cost_usd,
       COALESCE(s.gpu_seconds, 0) AS gpu_seconds,
       COALESCE(s.total_cost_usd, 0) / NULLIF(t.tasks_succeeded, 0) AS cost_per_successful_task_usd,
       s.served_cached_tokens::double precision / NULLIF(s.served_prompt_tokens, 0) AS cache_hit_ratio
FROM s FULL OUTER JOIN t ON s.k = t.k
"""


BY_AGENT = grouped("cost_per_successful_task_by_agent", "agent", "COALESCE(l.agent, tk.agent, '(none)')", "agent")
BY_TENANT = grouped("cost_per_successful_task_by_tenant", "tenant", "l.tenant", "tenant")
BY_DAY = grouped(
    "cost_per_successful_task_by_day",
    "day",
    "(l.started_at AT TIME ZONE 'UTC')::date",
    "(COALESCE(finished_at, started_at) AT TIME ZONE 'UTC')::date",
)

CALL_WASTE = """
CREATE VIEW llm_call_waste AS
WITH prev AS (
    SELECT id,
           LAG(prompt_tokens + completion_tokens) OVER (
               PARTITION BY COALESCE(session_id, task_id)
               ORDER BY started_at, attempt_key COLLATE "C"
           ) AS prev_context_tokens
    FROM llm_calls
    WHERE outcome = 'success' AND COALESCE(session_id, task_id) IS NOT NULL
),
c AS (
    SELECT l.*, tk.status AS task_status, p.prev_context_tokens,
           GREATEST(l.prompt_tokens - l.cached_tokens, 0) AS uncached_tokens,
           CASE
               WHEN tk.status IN ('failed', 'failed-deadline', 'cancelled') THEN 'failed_task'
               WHEN l.outcome = 'shed' THEN 'shed'
               WHEN l.outcome IN ('error', 'timeout', 'cancelled') THEN 'retry'
               ELSE 'useful'
           END AS waste_category
    FROM llm_calls l
    LEFT JOIN tasks tk ON tk.task_id = l.task_id
    LEFT JOIN prev p ON p.id = l.id
)
SELECT id, attempt_key, task_id, session_id, tenant, agent, started_at, outcome,
       prompt_tokens, cached_tokens, uncached_tokens, prev_context_tokens, cost_usd, waste_category,
       CASE
           WHEN waste_category = 'useful' AND outcome = 'success'
                AND uncached_tokens > 0 AND prev_context_tokens IS NOT NULL
           THEN cost_usd
                * (CASE
                       WHEN ttft_ms IS NOT NULL AND total_ms > queue_ms
                       THEN LEAST(GREATEST((ttft_ms - queue_ms) / (total_ms - queue_ms), 0), 1)
                       ELSE uncached_tokens::double precision
                            / NULLIF(uncached_tokens + completion_tokens, 0)
                   END)
                * GREATEST(LEAST(prompt_tokens, prev_context_tokens) - cached_tokens, 0)
                / uncached_tokens
           ELSE 0
       END AS cache_miss_usd
FROM c
"""

WASTE = """
CREATE VIEW waste_breakdown AS
SELECT COALESCE(SUM(cost_usd), 0) AS total_cost_usd,
       COALESCE(SUM(cost_usd) FILTER (WHERE waste_category = 'failed_task'), 0) AS failed_tasks_usd,
       COALESCE(SUM(cost_usd) FILTER (WHERE waste_category = 'retry'), 0) AS retries_usd,
       COALESCE(SUM(cost_usd) FILTER (WHERE waste_category = 'shed'), 0) AS shed_usd,
       COALESCE(SUM(cache_miss_usd), 0) AS cache_miss_usd
FROM llm_call_waste
"""

VIEWS = [
    ("cost_per_successful_task", OVERALL),
    ("cost_per_successful_task_by_agent", BY_AGENT),
    ("cost_per_successful_task_by_tenant", BY_TENANT),
    ("cost_per_successful_task_by_day", BY_DAY),
    ("llm_call_waste", CALL_WASTE),
    ("waste_breakdown", WASTE),
]


def upgrade() -> None:
    for _name, sql in VIEWS:
        op.execute(sql)


def downgrade() -> None:
    for name, _sql in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
