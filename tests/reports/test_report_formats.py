"""Rows written through the CostWriter into real Postgres; cost per successful task computed by
hand from those rows equals the figure in every format (json, csv, html, table), the SQL views
agree with the report, and bad flags are one clear line."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _report_scenario import SINCE, UNTIL, fleet, hand_headline
from sqlalchemy import text

from taskplane.errors import UserError
from taskplane.reports.command import ReportOptions, html_report, parse_when, run_report
from taskplane.reports.compute import build_report
from taskplane.reports.render import usd
from taskplane.store import db
from taskplane.store.records import TaskStatus
from taskplane.store.writer import CostWriter


async def _fill(url: str, outbox: Path) -> None:
    attempts, tasks = fleet()
    async with CostWriter(url, outbox) as writer:
        for t in tasks:
            await writer.upsert_task(t.model_copy(update={"status": TaskStatus.RUNNING, "finished_at": None, "deadline_met": None}))
        await asyncio.gather(*(writer.record_attempt(a) for a in attempts))
        for t in tasks:
            await writer.upsert_task(t)
        assert await writer.flush(timeout=60)


def _report(url: str, state: Path, fmt: str, out: Path, **kw: str | None) -> str:
    args: dict[str, object] = {"since": SINCE.isoformat(), "until": UNTIL.isoformat(), "group_by": "tenant", "tenant": None}
    args.update(kw)
    run_report(ReportOptions(fmt=fmt, out=out, database_url=url, state_dir=state, **args))  # type: ignore[arg-type]
    return out.read_text()


async def test_every_format_carries_the_hand_computed_figure(fresh_db_url: str, tmp_path: Path) -> None:
    await _fill(fresh_db_url, tmp_path / "outbox")
    attempts, tasks = fleet()
    total, ok, failed, per_task = hand_headline(attempts, tasks)

    js = json.loads(await asyncio.to_thread(_report, fresh_db_url, tmp_path, "json", tmp_path / "r.json"))
    assert js["cost_per_successful_task_usd"] == pytest.approx(per_task, rel=1e-12)
    assert js["total_cost_usd"] == pytest.approx(total, rel=1e-12)
    assert (js["tasks_succeeded"], js["tasks_failed"]) == (ok, failed)
    assert {g["key"] for g in js["groups"]} == {"acme", "globex", "initech"}
    assert set(js["waste"]) >= {"failed_tasks_usd", "retries_usd", "cache_miss_usd", "shed_usd"}

    rows = list(csv.DictReader(io.StringIO(await asyncio.to_thread(_report, fresh_db_url, tmp_path, "csv", tmp_path / "r.csv"))))
    assert rows[0]["scope"] == "total"
    assert float(rows[0]["cost_per_successful_task_usd"]) == pytest.approx(per_task, rel=1e-12)
    assert int(rows[0]["tasks_succeeded"]) == ok and int(rows[0]["tasks_failed"]) == failed
    for tenant in ("acme", "globex", "initech"):
        _, _, _, t_per = hand_headline(attempts, tasks, tenant=tenant)
        row = next(r for r in rows if r["key"] == tenant)
        assert float(row["cost_per_successful_task_usd"]) == pytest.approx(t_per, rel=1e-12)

    page = await asyncio.to_thread(_report, fresh_db_url, tmp_path, "html", tmp_path / "r.html")
    m = re.search(r'id="cost-per-successful-task" data-value="([^"]+)">([^<]+)<', page)
    assert m is not None
    assert float(m.group(1)) == pytest.approx(per_task, rel=1e-12)
    assert m.group(2) == usd(per_task)
    assert page.count("<svg") >= 4 and "<script src" not in page and "http://" not in page.split("<svg")[0]

    table = await asyncio.to_thread(_report, fresh_db_url, tmp_path, "table", tmp_path / "r.txt")
    line = next(ln for ln in table.splitlines() if "Cost per successful task" in ln)
    assert usd(per_task) in line
    assert re.search(rf"Tasks succeeded \(within deadline\)\s+{ok}\b", table)

    # one tenant only
    js_t = json.loads(await asyncio.to_thread(_report, fresh_db_url, tmp_path, "json", tmp_path / "t.json", tenant="globex"))
    assert js_t["cost_per_successful_task_usd"] == pytest.approx(hand_headline(attempts, tasks, tenant="globex")[3])


async def test_sql_views_agree_with_the_report(fresh_db_url: str, tmp_path: Path) -> None:
    await _fill(fresh_db_url, tmp_path / "outbox")
    attempts, tasks = fleet()
    report = build_report(attempts, tasks)  # all time, like the views
    engine = db.create_engine(fresh_db_url)
    try:
        async with engine.connect() as conn:
            overall = (await conn.execute(text("SELECT * FROM cost_per_successful_task"))).mappings().one()
            waste = (await conn.execute(text("SELECT * FROM waste_breakdown"))).mappings().one()
            by_tenant = {r["tenant"]: r for r in (await conn.execute(text("SELECT * FROM cost_per_successful_task_by_tenant"))).mappings()}
            by_agent = {r["agent"]: r for r in (await conn.execute(text("SELECT * FROM cost_per_successful_task_by_agent"))).mappings()}
            by_day = {str(r["day"]): r for r in (await conn.execute(text("SELECT * FROM cost_per_successful_task_by_day"))).mappings()}
    finally:
        await engine.dispose()
    assert overall["cost_per_successful_task_usd"] == pytest.approx(report.cost_per_successful_task_usd)
    assert overall["tasks_succeeded"] == report.tasks_succeeded
    assert overall["tasks_failed"] == report.tasks_failed
    assert overall["cost_per_request_usd"] == pytest.approx(report.cost_per_request_usd)
    assert overall["cost_per_token_usd"] == pytest.approx(report.cost_per_token_usd)
    assert overall["cache_hit_ratio"] == pytest.approx(report.cache_hit_ratio)
    for key in ("failed_tasks_usd", "retries_usd", "shed_usd", "cache_miss_usd"):
        assert waste[key] == pytest.approx(getattr(report.waste, key), abs=1e-12), key
    assert report.waste.cache_miss_usd > 0
    for dim, view in (("tenant", by_tenant), ("agent", by_agent), ("day", by_day)):
        for g in report.groups_by[dim]:
            assert view[g.key]["total_cost_usd"] == pytest.approx(g.total_cost_usd), (dim, g.key)
            assert view[g.key]["tasks_succeeded"] == g.tasks_succeeded, (dim, g.key)
            if g.cost_per_successful_task_usd is None:
                assert view[g.key]["cost_per_successful_task_usd"] is None
            else:
                assert view[g.key]["cost_per_successful_task_usd"] == pytest.approx(g.cost_per_successful_task_usd)


async def test_html_report_for_the_gateway(fresh_db_url: str, tmp_path: Path) -> None:
    await _fill(fresh_db_url, tmp_path / "outbox")
    attempts, tasks = fleet()
    engine = db.create_engine(fresh_db_url)
    try:
        page = await html_report(engine, tenant="acme")
    finally:
        await engine.dispose()
    value = float(re.search(r'id="cost-per-successful-task" data-value="([^"]+)"', page).group(1))  # type: ignore[union-attr]
    assert value == pytest.approx(build_report(attempts, tasks, tenant="acme").cost_per_successful_task_usd)
    assert "tenant acme" in page
    assert (await html_report(fresh_db_url)).startswith("<!DOCTYPE html>")


async def test_group_by_adapter_in_every_format(fresh_db_url: str, tmp_path: Path) -> None:
    """Rows naming their adapter, through the writer and Postgres, grouped in every format."""
    attempts, tasks = fleet()
    named = [a.model_copy(update={"adapter": "sql" if i % 2 else None}) for i, a in enumerate(attempts)]
    async with CostWriter(fresh_db_url, tmp_path / "outbox") as writer:
        await asyncio.gather(*(writer.record_attempt(a) for a in named), *(writer.upsert_task(t) for t in tasks))
        assert await writer.flush(timeout=60)
    expected = {g.key: g for g in build_report(named, tasks, since=SINCE, until=UNTIL, group_by="adapter").groups}
    assert set(expected) == {"sql", "(base model)"}

    js = json.loads(await asyncio.to_thread(_report, fresh_db_url, tmp_path, "json", tmp_path / "a.json", group_by="adapter"))
    assert js["group_by"] == "adapter"
    for g in js["groups"]:
        assert g["cost_per_successful_task_usd"] == pytest.approx(expected[g["key"]].cost_per_successful_task_usd)
    rows = list(csv.DictReader(io.StringIO(
        await asyncio.to_thread(_report, fresh_db_url, tmp_path, "csv", tmp_path / "a.csv", group_by="adapter"))))
    assert {r["key"] for r in rows if r["scope"] != "total"} == set(expected)
    page = await asyncio.to_thread(_report, fresh_db_url, tmp_path, "html", tmp_path / "a.html", group_by="adapter")
    assert 'id="groups-adapter"' in page and 'data-key="sql"' in page
    table = await asyncio.to_thread(_report, fresh_db_url, tmp_path, "table", tmp_path / "a.txt", group_by="adapter")
    assert "By adapter" in table and "sql" in table


def test_bad_flags_are_one_line(tmp_path: Path) -> None:
    url = "postgresql+asyncpg://postgres@127.0.0.1:1/taskplane"
    cases = [
        ({"fmt": "pdf"}, "--format 'pdf' is not known"),
        ({"group_by": "colour"}, "--group-by 'colour' is not known"),
        ({"since": "yesterday-ish"}, "--since 'yesterday-ish' is not a date"),
        ({"since": "2031-01-02", "until": "2031-01-01"}, "must be later than --since"),
        ({}, "cannot reach Postgres"),
    ]
    for overrides, message in cases:
        args: dict[str, object] = {"since": None, "until": None, "group_by": "tenant", "fmt": "json", "out": None,
                                   "tenant": None, "database_url": url, "state_dir": tmp_path}
        args.update(overrides)
        with pytest.raises(UserError) as info:
            run_report(ReportOptions(**args))  # type: ignore[arg-type]
        assert message in str(info.value) and "\n" not in str(info.value)


def test_parse_when() -> None:
    assert parse_when("2031-03-04", "--since") == SINCE.replace(hour=0)
    assert parse_when("2031-03-04T09:00:00Z", "--since") == SINCE
    assert parse_when("2h", "--since", now=UNTIL) == SINCE
    assert parse_when(None, "--since") is None


async def test_cli_report_json(fresh_db_url: str, tmp_path: Path) -> None:
    await _fill(fresh_db_url, tmp_path / "outbox")
    env = {**os.environ, "TASKPLANE_DATABASE_URL": fresh_db_url}
    cmd = [sys.executable, "-m", "taskplane.cli", "report", "--format", "json", "--since", SINCE.isoformat(),
           "--until", UNTIL.isoformat(), "--group-by", "agent"]
    done = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    for key in ("tasks_succeeded", "tasks_failed", "total_cost_usd", "cost_per_successful_task_usd"):
        assert key in data
    assert data["cost_per_successful_task_usd"] == pytest.approx(hand_headline(*fleet())[3])
    bad = await asyncio.to_thread(
        subprocess.run, [*cmd[:4], "--format", "pdf"], capture_output=True, text=True, env=env, timeout=120
    )
    assert bad.returncode != 0
    assert len(bad.stderr.strip().splitlines()) == 1 and "--format" in bad.stderr
