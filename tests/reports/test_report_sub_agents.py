"""Sub-agents roll up into their goal: in the report (``--group-by agent``) and in the SQL
views of migration 0004, goals are the tasks and every call of a tree counts for the goal's
agent; ``--count-sub-agents`` (and the views named ``counting_sub_agents``) count each
sub-agent's task as a task of its own. The views agree with the report on real Postgres."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path

import pytest
from _report_scenario import fleet
from sqlalchemy import text

from taskplane.reports.command import ReportOptions, run_report
from taskplane.reports.compute import build_report
from taskplane.store import db
from taskplane.store.records import AttemptRecord, Outcome, TaskRecord, TaskStatus
from taskplane.store.writer import CostWriter

HELPER_STATUSES = (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.SUCCEEDED, TaskStatus.CANCELLED)


def _call(task_id: str, agent: str, tenant: str, k: int, cost: float, started: object) -> AttemptRecord:
    return AttemptRecord(attempt_key=f"{task_id}:s{k}:a1", task_id=task_id, step=k, session_id=task_id,
                         tenant=tenant, agent=agent, model_requested="llama-3.1-8b", model_served="llama-3.1-8b",
                         gpu="h100", prompt_tokens=300, cached_tokens=100, completion_tokens=40, cost_usd=cost,
                         gpu_seconds=cost * 1440, outcome=Outcome.SUCCESS, started_at=started)  # type: ignore[arg-type]


def with_sub_agents() -> tuple[list[AttemptRecord], list[TaskRecord]]:
    """The report scenario plus sub-agents under every third goal: a helper (with rows of its
    own, succeeding or failing whatever the goal does), a grandchild under some helpers, and
    under a few goals a legacy sub-agent whose calls have no task row (written before 0004)."""
    attempts, tasks = fleet()
    goals = [t for t in tasks if t.task_id.startswith("task-")]
    for n, goal in enumerate(goals[::3]):
        when = goal.started_at + timedelta(seconds=30)
        child_id = f"{goal.task_id}.helper-0"
        status = HELPER_STATUSES[n % len(HELPER_STATUSES)]
        ended = None if goal.status is TaskStatus.RUNNING else goal.finished_at
        status = TaskStatus.RUNNING if ended is None else status
        tasks.append(TaskRecord(
            task_id=child_id, agent="helper", tenant=goal.tenant, status=status, deadline=goal.deadline,
            deadline_met=None if ended is None else status is TaskStatus.SUCCEEDED, started_at=when,
            finished_at=ended, parent_task_id=goal.task_id, root_task_id=goal.task_id))
        attempts += [_call(child_id, "helper", goal.tenant, k, 0.01 * (k + 1), when + timedelta(seconds=k))
                     for k in range(2)]
        if n % 2 == 0:
            grand_id = f"{child_id}.digger-0"
            tasks.append(TaskRecord(
                task_id=grand_id, agent="digger", tenant=goal.tenant, status=TaskStatus.SUCCEEDED,
                deadline_met=True, started_at=when, finished_at=when + timedelta(seconds=5),
                parent_task_id=child_id, root_task_id=goal.task_id))
            attempts.append(_call(grand_id, "digger", goal.tenant, 0, 0.02, when + timedelta(seconds=3)))
        if n % 3 == 0:
            legacy_id = f"{goal.task_id}.legacy-0"
            attempts.append(_call(legacy_id, "legacy", goal.tenant, 0, 0.03, when + timedelta(seconds=4)))
    return attempts, tasks


def _goal_agent(task_id: str, tasks: dict[str, TaskRecord]) -> str:
    return tasks[task_id.split(".")[0]].agent


def test_sub_agents_roll_up_into_the_goals_agent_unless_counted() -> None:
    attempts, tasks = with_sub_agents()
    by_id = {t.task_id: t for t in tasks}
    goals = [t for t in tasks if t.parent_task_id is None]
    report = build_report(attempts, tasks)
    assert report.tasks_total == len(goals) and report.count_sub_agents is False
    assert report.sub_agent_tasks == len(tasks) - len(goals) > 0
    agents = {g.key: g for g in report.groups_by["agent"]}
    assert {"helper", "digger", "legacy"}.isdisjoint(agents)  # no agent without tasks of its own
    for agent in {t.agent for t in goals}:
        tree = [a for a in attempts if a.task_id and _goal_agent(a.task_id, by_id) == agent]
        assert agents[agent].total_cost_usd == pytest.approx(sum(a.cost_usd for a in tree))
        assert agents[agent].calls == len(tree)
    # a sub-agent's spend is wasted when its goal failed, whatever its own ending
    wasted = sum(a.cost_usd for a in attempts if a.task_id and "." in a.task_id
                 and by_id[a.task_id.split(".")[0]].status in (TaskStatus.FAILED, TaskStatus.FAILED_DEADLINE,
                                                               TaskStatus.CANCELLED))
    base = build_report(*fleet())
    assert report.waste.failed_tasks_usd - base.waste.failed_tasks_usd == pytest.approx(wasted)
    assert report.tasks_succeeded == base.tasks_succeeded  # the children changed no goal count

    each = build_report(attempts, tasks, count_sub_agents=True)
    assert each.tasks_total == len(tasks) and each.count_sub_agents is True
    agents = {g.key: g for g in each.groups_by["agent"]}
    assert agents["helper"].tasks_total == sum(1 for t in tasks if t.agent == "helper")
    assert agents["helper"].calls == sum(1 for a in attempts if a.agent == "helper")
    assert agents["legacy"].tasks_total == 0 and agents["legacy"].calls > 0  # calls without a row
    assert sum(g.total_cost_usd for g in each.groups_by["agent"]) == pytest.approx(each.total_cost_usd)
    assert each.tasks_succeeded > report.tasks_succeeded
    assert each.cost_per_successful_task_usd < report.cost_per_successful_task_usd  # type: ignore[operator]


async def _fill(url: str, outbox: Path, attempts: list[AttemptRecord], tasks: list[TaskRecord]) -> None:
    async with CostWriter(url, outbox) as writer:
        await asyncio.gather(*(writer.record_attempt(a) for a in attempts))
        for t in tasks:
            await writer.upsert_task(t)
        assert await writer.flush(timeout=60)


async def _view(engine: object, name: str) -> list[dict[str, object]]:
    async with engine.connect() as conn:  # type: ignore[attr-defined]
        return [dict(r) for r in (await conn.execute(text(f"SELECT * FROM {name}"))).mappings()]


async def test_sql_views_roll_up_sub_agents_as_the_report_does(fresh_db_url: str, tmp_path: Path) -> None:
    attempts, tasks = with_sub_agents()
    await _fill(fresh_db_url, tmp_path / "outbox", attempts, tasks)
    goals, each = build_report(attempts, tasks), build_report(attempts, tasks, count_sub_agents=True)
    engine = db.create_engine(fresh_db_url)
    try:
        overall = (await _view(engine, "cost_per_successful_task"))[0]
        by_agent = {r["agent"]: r for r in await _view(engine, "cost_per_successful_task_by_agent")}
        counting = {r["agent"]: r for r in await _view(engine, "cost_per_successful_task_by_agent_counting_sub_agents")}
        by_tenant = {r["tenant"]: r for r in await _view(engine, "cost_per_successful_task_by_tenant")}
        waste = (await _view(engine, "waste_breakdown"))[0]
        fleet_view = (await _view(engine, "fleet_cost_per_successful_task"))[0]
    finally:
        await engine.dispose()
    assert overall["tasks_total"] == goals.tasks_total and overall["tasks_succeeded"] == goals.tasks_succeeded
    assert overall["cost_per_successful_task_usd"] == pytest.approx(goals.cost_per_successful_task_usd)
    assert overall["sub_agent_tasks_total"] == goals.sub_agent_tasks
    assert overall["tasks_succeeded"] + overall["sub_agent_tasks_succeeded"] == each.tasks_succeeded
    assert overall["cost_per_successful_task_counting_sub_agents_usd"] == pytest.approx(each.cost_per_successful_task_usd)
    assert fleet_view["tasks_succeeded"] == goals.tasks_succeeded
    for report, view in ((goals, by_agent), (each, counting)):
        assert set(view) == {g.key for g in report.groups_by["agent"]}
        for g in report.groups_by["agent"]:
            row = view[g.key]
            assert row["total_cost_usd"] == pytest.approx(g.total_cost_usd), g.key
            assert (row["calls"], row["tasks_total"], row["tasks_succeeded"]) == (g.calls, g.tasks_total,
                                                                                 g.tasks_succeeded), g.key
    subs = [t for t in tasks if t.root_task_id]
    goal_agent = {t.task_id: t.agent for t in tasks if t.parent_task_id is None}
    for agent, row in by_agent.items():
        assert row["sub_agent_tasks"] == sum(1 for t in subs if goal_agent[t.root_task_id or ""] == agent)
        assert row["sub_agent_calls"] == sum(1 for a in attempts if a.task_id and "." in a.task_id
                                             and goal_agent[a.task_id.split(".")[0]] == agent)
    for g in goals.groups_by["tenant"]:
        assert by_tenant[g.key]["tasks_succeeded"] == g.tasks_succeeded
    for key in ("failed_tasks_usd", "retries_usd", "shed_usd", "cache_miss_usd"):
        assert waste[key] == pytest.approx(getattr(goals.waste, key), abs=1e-12), key


async def test_report_command_counts_sub_agents_when_asked(fresh_db_url: str, tmp_path: Path) -> None:
    attempts, tasks = with_sub_agents()
    await _fill(fresh_db_url, tmp_path / "outbox", attempts, tasks)

    def run(count: bool) -> dict[str, object]:
        out = tmp_path / f"r-{count}.json"
        run_report(ReportOptions(group_by="agent", fmt="json", out=out, database_url=fresh_db_url,
                                 state_dir=tmp_path, count_sub_agents=count))
        return json.loads(out.read_text())  # type: ignore[no-any-return]

    plain, counted = await asyncio.to_thread(run, False), await asyncio.to_thread(run, True)
    n_goals = sum(1 for t in tasks if t.parent_task_id is None)
    assert (plain["tasks_total"], plain["count_sub_agents"]) == (n_goals, False)
    assert (counted["tasks_total"], counted["count_sub_agents"]) == (len(tasks), True)
    assert "helper" not in {g["key"] for g in plain["groups"]}  # type: ignore[index, union-attr]
    assert "helper" in {g["key"] for g in counted["groups"]}  # type: ignore[index, union-attr]
    assert plain["total_cost_usd"] == pytest.approx(counted["total_cost_usd"])
