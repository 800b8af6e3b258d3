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
import re
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


def _edit(sql: str, old: str, new: str) -> str:
    """Replace the one ``old`` in a view of migration 0002 (it must be there exactly once)."""
    assert sql.count(old) == 1, f"migration 0002's views changed shape: {old!r}"
    return sql.replace(old, new)


_OWN_TASK = "LEFT JOIN tasks tk ON tk.task_id = l.task_id"
_GOAL_TASK = "JOIN llm_call_goals cg ON cg.id = l.id LEFT JOIN tasks tk ON tk.task_id = cg.goal_task_id"


def _grouped(name: str, key: str, spend_key: str, task_key: str, *, goals_only: bool = True) -> str:
    """0002's grouped view (spend from llm_calls, task counts from tasks), counting goals only
    unless ``goals_only`` is false."""
    sql = R2.grouped(name, key, spend_key, task_key)
    return _edit(sql, " FROM tasks GROUP BY 1)", f" FROM tasks WHERE {GOAL} GROUP BY 1)") if goals_only else sql


# spend under the agent of each call's goal (``tk`` is the goal), goals counted, and how much
# of it the sub-agents made
BY_AGENT = _grouped("cost_per_successful_task_by_agent", "agent", "COALESCE(tk.agent, l.agent, '(none)')", "agent")
BY_AGENT = _edit(BY_AGENT, _OWN_TASK, _GOAL_TASK)
BY_AGENT = _edit(BY_AGENT, "    FROM llm_calls l ",
                 "    , COUNT(*) FILTER (WHERE cg.by_sub_agent) AS sub_agent_calls\n    FROM llm_calls l ")
BY_AGENT = _edit(BY_AGENT, " GROUP BY 1)\nSELECT", """ GROUP BY 1),
sub AS (SELECT g.agent AS k, COUNT(*) AS sub_agent_tasks
        FROM tasks c JOIN tasks g ON g.task_id = c.root_task_id GROUP BY 1)
SELECT""")
BY_AGENT = _edit(BY_AGENT, " AS cache_hit_ratio\nFROM s FULL OUTER JOIN t ON s.k = t.k", """ AS cache_hit_ratio,
       COALESCE((SELECT sub.sub_agent_tasks FROM sub WHERE sub.k = COALESCE(s.k, t.k)), 0) AS sub_agent_tasks,
       COALESCE(s.sub_agent_calls, 0) AS sub_agent_calls
FROM s FULL OUTER JOIN t ON s.k = t.k""")
# every task under its own agent (``tk`` is the call's own task), sub-agents counted
BY_AGENT_COUNTING_SUB_AGENTS = _grouped(
    "cost_per_successful_task_by_agent_counting_sub_agents", "agent", "COALESCE(tk.agent, l.agent, '(none)')",
    "agent", goals_only=False)
BY_TENANT = _grouped("cost_per_successful_task_by_tenant", "tenant", "l.tenant", "tenant")
BY_DAY = _grouped(
    "cost_per_successful_task_by_day", "day", "(l.started_at AT TIME ZONE 'UTC')::date",
    "(COALESCE(finished_at, started_at) AT TIME ZONE 'UTC')::date",
)

# 0002's waste view with the call's goal in place of its own task: a sub-agent's spend is
# wasted when the goal it served failed, whatever the sub-agent's own ending.
CALL_WASTE = _edit(R2.CALL_WASTE, _OWN_TASK, "LEFT " + _GOAL_TASK)

_GOALS_ONLY = " WHERE tasks.parent_task_id IS NULL"


def _fleet_view(goals_only: bool) -> None:
    """Migration 0003's fleet view, its task count limited to goals (or back): the view's own
    definition from Postgres, edited in one place, so 0003's SQL is not copied here."""
    sql = op.get_bind().execute(
        sa.text("SELECT pg_get_viewdef('fleet_cost_per_successful_task'::regclass, true)")).scalar_one()
    if goals_only:
        assert len(re.findall(r"FROM tasks\b", sql)) == 1, "migration 0003's fleet view changed shape"
        sql = re.sub(r"FROM tasks\b", "FROM tasks" + _GOALS_ONLY, sql)
    else:
        sql = re.sub(r"\s+WHERE tasks\.parent_task_id IS NULL", "", sql)
    op.execute(f"CREATE OR REPLACE VIEW fleet_cost_per_successful_task AS {sql}")


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
]


def upgrade() -> None:
    for name, _sql in reversed(R2.VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.add_column("tasks", sa.Column("parent_task_id", sa.Text))
    op.add_column("tasks", sa.Column("root_task_id", sa.Text))
    op.create_index("ix_tasks_root_task_id", "tasks", ["root_task_id"])
    for _name, sql in VIEWS:
        op.execute(sql)
    _fleet_view(goals_only=True)


def downgrade() -> None:
    _fleet_view(goals_only=False)
    for name, _sql in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_index("ix_tasks_root_task_id", table_name="tasks")
    op.drop_column("tasks", "root_task_id")
    op.drop_column("tasks", "parent_task_id")
    for _name, sql in R2.VIEWS:
        op.execute(sql)
