"""fleet_hours rows in Postgres make cost per successful task fully loaded (idle included)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from taskplane.autoscale.fleet import FleetBook
from taskplane.autoscale.types import Generation, Plan
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
