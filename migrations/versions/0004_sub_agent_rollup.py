"""Sub-agents: task rows of their own, linked to their goal, and views that roll them up.

A sub-agent's task now gets its own ``tasks`` row with ``parent_task_id`` (the task that
started it) and ``root_task_id`` (the goal at the top of the tree); a goal has neither.
One user goal is still one task: every view counts goals only, and the calls, attempts
and cost of a sub-agent roll up into its goal (and the goal's agent). The views that
count sub-agents as tasks of their own say so in their names and columns:

- ``llm_call_goals``: each call's goal task (its own task's root; for a call of a
  sub-agent that has no row, the longest ``<goal>.`` prefix of its task id, as the report
  does) and whether a sub-agent made it;
- ``cost_per_successful_task`` gains ``sub_agent_tasks_total``,
  ``sub_agent_tasks_succeeded`` and ``cost_per_successful_task_counting_sub_agents_usd``;
- ``cost_per_successful_task_by_agent`` rolls sub-agents' spend into the goal's agent and
  gains ``sub_agent_tasks`` and ``sub_agent_calls``;
- ``cost_per_successful_task_by_agent_counting_sub_agents``: every task (goal or
  sub-agent) counts under its own agent with its own calls (``taskplane report
  --group-by agent --count-sub-agents``);
- ``llm_call_waste`` / ``waste_breakdown``: a call is wasted when its goal failed;
- by tenant, by day and ``fleet_cost_per_successful_task`` count goals only.

Revision ID: 0004_sub_agent_rollup
Revises: 0003_fleet_hours
Create Date: 2026-12-02
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0004_sub_agent_rollup"
down_revision: str | Sequence[str] | None = "0003_fleet_hours"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _revision(filename: str) -> ModuleType:
    """An earlier revision's module (its SQL fragments are reused, never edited)."""
    spec = importlib.util.spec_from_file_location(f"_taskplane_rev_{filename}", Path(__file__).with_name(filename))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


R2 = _revision("0002_report_views.py")
GOAL = "parent_task_id IS NULL"

CALL_GOALS = """
CREATE VIEW llm_call_goals AS
SELECT l.id, l.task_id,
       COALESCE(own.root_task_id, own.task_id, legacy.goal_task_id) AS goal_task_id,
       (own.parent_task_id IS NOT NULL OR (own.task_id IS NULL AND legacy.goal_task_id IS NOT NULL)) AS by_sub_agent
FROM llm_calls l
LEFT JOIN tasks own ON own.task_id = l.task_id
LEFT JOIN LATERAL (
    SELECT COALESCE(r.root_task_id, r.task_id) AS goal_task_id
    FROM tasks r
    WHERE own.task_id IS NULL AND strpos(l.task_id, '.') > 0 AND starts_with(l.task_id, r.task_id || '.')
    ORDER BY length(r.task_id) DESC
    LIMIT 1
) legacy ON true
"""

OVERALL = f"""
CREATE VIEW cost_per_successful_task AS
WITH s AS (SELECT {R2.SPEND} FROM llm_calls l),
     t AS (SELECT {R2.TASK_COUNTS} FROM tasks WHERE {GOAL}),
     sub AS (SELECT COUNT(*) AS sub_agent_tasks_total,
                    COUNT(*) FILTER (WHERE {R2.SUCCESSFUL}) AS sub_agent_tasks_succeeded
             FROM tasks WHERE NOT ({GOAL}))
SELECT t.tasks_total, t.tasks_succeeded, t.tasks_succeeded_late, t.tasks_failed,
       t.tasks_cancelled, t.tasks_running,
       s.calls, s.total_cost_usd, s.gpu_seconds, s.prompt_tokens, s.completion_tokens,
       {R2.RATIOS},
       sub.sub_agent_tasks_total, sub.sub_agent_tasks_succeeded,
       s.total_cost_usd / NULLIF(t.tasks_succeeded + sub.sub_agent_tasks_succeeded, 0)
           AS cost_per_successful_task_counting_sub_agents_usd
FROM s CROSS JOIN t CROSS JOIN sub
"""


def _grouped(name: str, key: str, spend_key: str, task_key: str, *, tasks_where: str, joins: str,
             extra_spend: str = "", extra_cte: str = "", extra_cols: str = "") -> str:
    """One row per key: spend from llm_calls (with ``joins``), task counts from the tasks
    that ``tasks_where`` selects; the shape of migration 0002's grouped views."""
    return f"""
CREATE VIEW {name} AS
WITH s AS (
    SELECT {spend_key} AS k, {R2.SPEND}{extra_spend}
    FROM llm_calls l {joins}
    GROUP BY 1
),
t AS (SELECT {task_key} AS k, {R2.TASK_COUNTS} FROM tasks WHERE {tasks_where} GROUP BY 1){extra_cte}
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
       s.served_cached_tokens::double precision / NULLIF(s.served_prompt_tokens, 0) AS cache_hit_ratio{extra_cols}
FROM s FULL OUTER JOIN t ON s.k = t.k
"""


_TO_GOAL = "JOIN llm_call_goals cg ON cg.id = l.id LEFT JOIN tasks g ON g.task_id = cg.goal_task_id"

BY_AGENT = _grouped(
    "cost_per_successful_task_by_agent", "agent", "COALESCE(g.agent, l.agent, '(none)')", "agent",
    tasks_where=GOAL, joins=_TO_GOAL,
    extra_spend=",\n    COUNT(*) FILTER (WHERE cg.by_sub_agent) AS sub_agent_calls",
    extra_cte=""",
sub AS (SELECT g.agent AS k, COUNT(*) AS sub_agent_tasks
        FROM tasks c JOIN tasks g ON g.task_id = c.root_task_id GROUP BY 1)""",
    extra_cols=""",
       COALESCE((SELECT sub.sub_agent_tasks FROM sub WHERE sub.k = COALESCE(s.k, t.k)), 0) AS sub_agent_tasks,
       COALESCE(s.sub_agent_calls, 0) AS sub_agent_calls""",
)
BY_AGENT_COUNTING_SUB_AGENTS = _grouped(
    "cost_per_successful_task_by_agent_counting_sub_agents", "agent",
    "COALESCE(own.agent, l.agent, '(none)')", "agent",
    tasks_where="true", joins="LEFT JOIN tasks own ON own.task_id = l.task_id",
)
BY_TENANT = _grouped("cost_per_successful_task_by_tenant", "tenant", "l.tenant", "tenant",
                     tasks_where=GOAL, joins="")
BY_DAY = _grouped(
    "cost_per_successful_task_by_day", "day", "(l.started_at AT TIME ZONE 'UTC')::date",
    "(COALESCE(finished_at, started_at) AT TIME ZONE 'UTC')::date", tasks_where=GOAL, joins="",
)

# 0002's waste view with the call's goal in place of its own task: a sub-agent's spend is
# wasted when the goal it served failed, whatever the sub-agent's own ending.
CALL_WASTE = R2.CALL_WASTE.replace(
    "LEFT JOIN tasks tk ON tk.task_id = l.task_id",
    "LEFT JOIN llm_call_goals cg ON cg.id = l.id\n    LEFT JOIN tasks tk ON tk.task_id = cg.goal_task_id",
)
assert CALL_WASTE != R2.CALL_WASTE, "migration 0002's waste view changed shape"

_FLEET = """
CREATE VIEW fleet_cost_per_successful_task AS
WITH f AS (
    SELECT COALESCE(SUM(EXTRACT(EPOCH FROM (COALESCE(stopped_at, now()) - started_at))) / 3600.0, 0)
               AS provisioned_gpu_hours,
           COALESCE(SUM(EXTRACT(EPOCH FROM (COALESCE(stopped_at, now()) - started_at)) / 3600.0
                        * cost_per_hour_usd), 0) AS fleet_cost_usd
    FROM fleet_hours),
b AS (SELECT COALESCE(SUM(gpu_seconds), 0) / 3600.0 AS busy_gpu_hours FROM llm_calls),
t AS (SELECT COUNT(*) FILTER (WHERE status = 'succeeded' AND deadline_met IS NOT FALSE) AS tasks_succeeded
      FROM tasks{where})
SELECT f.provisioned_gpu_hours, b.busy_gpu_hours,
       GREATEST(f.provisioned_gpu_hours - b.busy_gpu_hours, 0) AS idle_gpu_hours,
       f.fleet_cost_usd, t.tasks_succeeded,
       CASE WHEN t.tasks_succeeded > 0 THEN f.fleet_cost_usd / t.tasks_succeeded END
           AS fleet_cost_per_successful_task_usd
FROM f, b, t
"""

#: (name, SQL) in creation order; dropped in reverse.
VIEWS = [
    ("llm_call_goals", CALL_GOALS),
    ("cost_per_successful_task", OVERALL),
    ("cost_per_successful_task_by_agent", BY_AGENT),
    ("cost_per_successful_task_by_agent_counting_sub_agents", BY_AGENT_COUNTING_SUB_AGENTS),
    ("cost_per_successful_task_by_tenant", BY_TENANT),
    ("cost_per_successful_task_by_day", BY_DAY),
    ("llm_call_waste", CALL_WASTE),
    ("waste_breakdown", R2.WASTE),
    ("fleet_cost_per_successful_task", _FLEET.format(where=f" WHERE {GOAL}")),
]


def upgrade() -> None:
    for name in ("fleet_cost_per_successful_task", *(n for n, _ in reversed(R2.VIEWS))):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.add_column("tasks", sa.Column("parent_task_id", sa.Text))
    op.add_column("tasks", sa.Column("root_task_id", sa.Text))
    op.create_index("ix_tasks_root_task_id", "tasks", ["root_task_id"])
    for _name, sql in VIEWS:
        op.execute(sql)


def downgrade() -> None:
    for name, _sql in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_index("ix_tasks_root_task_id", table_name="tasks")
    op.drop_column("tasks", "root_task_id")
    op.drop_column("tasks", "parent_task_id")
    for _name, sql in R2.VIEWS:
        op.execute(sql)
    op.execute(_FLEET.format(where=""))
