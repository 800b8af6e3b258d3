"""fleet_hours rows in Postgres make cost per successful task fully loaded (idle included)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from taskplane.autoscale.fleet import FleetBook
from taskplane.autoscale.types import PREFILL_WEIGHT, Generation, Plan
from taskplane.reports.command import load_report
from taskplane.store import db
from taskplane.store.fleet_hours import fleet_report, write_intervals

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


async def test_fleet_hours_rows_and_the_loaded_cost(fresh_db_url: str) -> None:
    book = FleetBook("llama", [Generation("h100", 2.0, cold_start_s=18.0)])
    a = book.provision("h100", 0.0, ready=True)
    (b, _), = book.apply(Plan(pool="llama", desired=2, start=["h100"]), 0.0).start
    book.mark_ready(b, 18.0)
    book.apply(Plan(pool="llama", desired=1, drain=[b]), 1800.0)
    book.stopped(b, 1800.0, reason="drained")
    engine = db.create_engine(fresh_db_url)
    try:
        assert await write_intervals(engine, book.all_intervals(), EPOCH) == 2
        book.stopped(a, 3600.0, reason="drained")
        assert await write_intervals(engine, book.all_intervals(), EPOCH) == 2  # closes a, no duplicate
        async with engine.begin() as conn:
            await conn.execute(text(
                "INSERT INTO tasks (task_id, agent, tenant, priority, status, deadline_met, started_at, cost_usd,"
                " attempts, retries) VALUES ('t1', 'a', 'acme', 'standard', 'succeeded', true, :t, 0.1, 1, 0),"
                " ('t2', 'a', 'acme', 'standard', 'succeeded', true, :t, 0.1, 1, 0)"), {"t": EPOCH})
            n = (await conn.execute(text("SELECT COUNT(*) FROM fleet_hours"))).scalar_one()
        assert n == 2
        rep = await fleet_report(engine)
        assert abs(rep["provisioned_gpu_hours"] - 1.5) < 1e-6  # 1 h + 0.5 h, idle included
        assert abs(rep["fleet_cost_usd"] - 3.0) < 1e-6
        assert rep["idle_gpu_hours"] == rep["provisioned_gpu_hours"]  # no call ran
        assert abs(rep["fleet_cost_per_successful_task_usd"] - 1.5) < 1e-6
        # `taskplane report --format json` carries the same, windowed (intervals clipped)
        report = await load_report(engine)
        assert report.fleet is not None and report.tasks_succeeded == 2
        assert abs(report.fleet["fleet_cost_per_successful_task_usd"] - 1.5) < 1e-6  # type: ignore[operator]
        half = await load_report(engine, since=EPOCH, until=EPOCH + timedelta(minutes=30))
        assert half.fleet is not None and abs(half.fleet["provisioned_gpu_hours"] - 1.0) < 1e-6  # type: ignore[operator]
        assert (await load_report(engine, tenant="acme")).fleet is None  # no per-tenant idle share
    finally:
        await engine.dispose()


async def test_workflow_signals_are_learned_from_task_history(fresh_db_url: str) -> None:
    from datetime import timedelta as td

    from taskplane.autoscale.actuators.signals import history_signals
    from taskplane.store.fleet_hours import task_history

    now = datetime.now(UTC)
    engine = db.create_engine(fresh_db_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(
                "INSERT INTO tasks (task_id, agent, tenant, priority, status, deadline_met, started_at, finished_at,"
                " deadline, cost_usd, attempts, retries) VALUES"
                " ('done', 'coder', 'acme', 'standard', 'succeeded', true, :a, :b, NULL, 0, 4, 0),"
                " ('live', 'coder', 'acme', 'standard', 'running', NULL, :b, NULL, :dl, 0, 1, 0)"),
                {"a": now - td(seconds=40), "b": now - td(seconds=20), "dl": now + td(seconds=100)})
            rows = [("done", i, 1000, 600, 100, "r1") for i in range(4)] + [("live", 0, 2000, 0, 50, "r2")]
            for task, step, prompt, cached, completion, replica in rows:
                await conn.execute(text(
                    "INSERT INTO llm_calls (attempt_key, task_id, step, attempt, tenant, agent, model_requested,"
                    " replica, prompt_tokens, cached_tokens, completion_tokens, outcome, started_at)"
                    " VALUES (:k, :t, :s, 1, 'acme', 'coder', 'm', :r, :p, :c, :o, 'success', :at)"),
                    {"k": f"{task}:{step}:1", "t": task, "s": step, "r": replica, "p": prompt, "c": cached,
                     "o": completion, "at": now - td(seconds=10 - step)})
        workflows, profiles = history_signals(*await task_history(engine, prefill_weight=PREFILL_WEIGHT))
    finally:
        await engine.dispose()
    p = profiles["coder"]
    assert abs(p.work_per_step - (100 + 0.125 * 400)) < 1e-6  # completion + 1/8 of uncached prompt
    assert abs(p.seconds_per_step - 5.0) < 0.5  # 20 s over 4 calls
    (w,) = workflows
    assert w.task_id == "live" and w.steps_remaining == 3 and w.replica == "r2" and w.context_tokens == 2050
    assert w.budget_s is not None and 90 < w.budget_s <= 100
