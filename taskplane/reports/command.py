"""``taskplane report`` and the gateway's ``/reports`` page: rows from Postgres to a rendered report."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from taskplane.errors import UserError
from taskplane.reports.compute import GROUP_BY, build_report
from taskplane.reports.model import Report
from taskplane.reports.render import FORMATS, render, table_renderable
from taskplane.store import repo
from taskplane.store.db import create_engine, describe_url, is_unreachable
from taskplane.store.fleet_hours import fleet_window

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_when(value: str | None, flag: str, now: datetime | None = None) -> datetime | None:
    """An ISO date or date-time (UTC unless it says otherwise), or a span back from now (30m, 24h, 7d)."""
    if value is None or value.strip() == "":
        return None
    now = now or datetime.now(UTC)
    rel = _RELATIVE.match(value)
    if rel:
        return now - timedelta(**{_UNITS[rel.group(2)]: float(rel.group(1))})
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise UserError(
            f"{flag} {value!r} is not a date: use ISO 8601 (2025-01-31 or 2025-01-31T09:00:00Z) or a span like 24h, 7d"
        ) from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


def _check_choice(value: str, choices: tuple[str, ...], flag: str) -> str:
    if value not in choices:
        raise UserError(f"{flag} {value!r} is not known; use one of {'|'.join(choices)}")
    return value


async def load_report(
    engine: AsyncEngine,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    tenant: str | None = None,
    group_by: str = "tenant",
    count_sub_agents: bool = False,
) -> Report:
    """Query the window's rows and compute the report."""
    attempts, tasks = await repo.report_rows(engine, since=since, until=until, tenant=tenant)
    report = build_report(attempts, tasks, since=since, until=until, tenant=tenant, group_by=group_by,
                          count_sub_agents=count_sub_agents)
    intervals, hours, cost = await fleet_window(engine, since, until)
    if intervals and tenant is None:  # the fleet is shared: no per-tenant share of idle time
        report.fleet = {
            "provisioned_gpu_hours": round(hours, 6),
            "idle_gpu_hours": round(max(0.0, hours - report.gpu_seconds / 3600.0), 6),
            "fleet_cost_usd": round(cost, 6),
            "fleet_cost_per_successful_task_usd": round(cost / report.tasks_succeeded, 6)
            if report.tasks_succeeded else None,
        }
    return report


async def _load_from_url(database_url: str, **kw: object) -> Report:
    engine = create_engine(database_url, pool_size=1)
    try:
        return await load_report(engine, **kw)  # type: ignore[arg-type]
    except Exception as exc:
        if is_unreachable(exc):
            first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(
                f"cannot reach Postgres at {describe_url(database_url)} ({first[:160]}); "
                "start it (`taskplane dev up`) or fix TASKPLANE_DATABASE_URL"
            ) from None
        if "does not exist" in str(exc) and "relation" in str(exc):
            raise UserError(
                f"the database at {describe_url(database_url)} has no taskplane schema; run `taskplane db upgrade`"
            ) from None
        raise
    finally:
        await engine.dispose()


@dataclass(frozen=True, kw_only=True)
class ReportOptions:
    """What ``taskplane report`` is asked for: its flags as given (dates not parsed yet)."""

    since: str | None = None
    until: str | None = None
    group_by: str = "tenant"
    fmt: str = "table"
    out: Path | None = None
    tenant: str | None = None
    database_url: str | None = None  # None: the dev stack's under state_dir
    state_dir: Path = Path(".taskplane")
    count_sub_agents: bool = False


def run_report(options: ReportOptions) -> None:
    """``taskplane report``: validate the flags, read Postgres, print or write the report."""
    fmt = _check_choice(options.fmt, FORMATS, "--format")
    group_by = _check_choice(options.group_by, GROUP_BY, "--group-by")
    start, end = parse_when(options.since, "--since"), parse_when(options.until, "--until")
    if start is not None and end is not None and end <= start:
        raise UserError(f"--until ({end.isoformat()}) must be later than --since ({start.isoformat()})")
    database_url = options.database_url
    if database_url is None:
        from taskplane.dev.stack import resolve_database_url

        database_url = resolve_database_url(None, options.state_dir)
    report = asyncio.run(_load_from_url(database_url, since=start, until=end, tenant=options.tenant,
                                        group_by=group_by, count_sub_agents=options.count_sub_agents))
    if fmt == "html" and not os.environ.get("TASKPLANE_TEMPORAL_UI_URL"):
        from taskplane.dev.stack import status

        ui = status(options.state_dir).get("temporal_ui_url")
        if ui:  # failed tasks link to the dev stack's Temporal UI
            os.environ["TASKPLANE_TEMPORAL_UI_URL"] = str(ui)
    _output(report, fmt, options.out)


def _output(report: Report, fmt: str, out: Path | None) -> None:
    """Write the report to ``out``, or print it (the table through rich)."""
    if out is not None:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(render(report, fmt), encoding="utf-8")
        except OSError as exc:
            raise UserError(f"cannot write the report to {out}: {exc.strerror or exc}") from None
        return
    if fmt == "table":
        from rich.console import Console

        Console().print(table_renderable(report))
    else:
        sys.stdout.write(render(report, fmt))


async def html_report(
    engine_or_url: AsyncEngine | str,
    tenant: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> str:
    """The HTML report for the gateway's ``/reports`` (``tenant`` limits it to one tenant).

    Pass the gateway's engine to reuse its pool, or a URL for a one-off connection.
    Rendering (matplotlib) runs in a thread so the event loop keeps serving.
    """
    if isinstance(engine_or_url, str):
        report = await _load_from_url(engine_or_url, since=since, until=until, tenant=tenant)
    else:
        report = await load_report(engine_or_url, since=since, until=until, tenant=tenant)
    from taskplane.reports.html import render_html

    return await asyncio.to_thread(render_html, report)
