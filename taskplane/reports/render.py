"""The report's four faces: a terminal table (rich), JSON, CSV and one self-contained HTML file.

All four render the same ``Report``; the figures a reader compares (cost per successful
task, totals) are formatted by the same helpers, so they agree to the digit shown.
"""

from __future__ import annotations

import csv
import io
import json
import textwrap
from collections.abc import Callable

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from taskplane.reports.formatting import count, pct, usd, window_text
from taskplane.reports.model import GroupRow, Report
from taskplane.store.records import Outcome

FORMATS: tuple[str, ...] = ("table", "json", "csv", "html")

CSV_COLUMNS = (
    "scope",
    "key",
    "tasks_total",
    "tasks_succeeded",
    "tasks_succeeded_late",
    "tasks_failed",
    "tasks_cancelled",
    "tasks_running",
    "calls",
    "total_cost_usd",
    "gpu_seconds",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cost_per_successful_task_usd",
    "cache_hit_ratio",
)


# ---- JSON ----------------------------------------------------------------------------


def render_json(report: Report) -> str:
    return json.dumps(report.to_json_dict(), indent=2) + "\n"


# ---- CSV -----------------------------------------------------------------------------


def _csv_row(scope: str, row: GroupRow) -> list[object]:
    data = row.model_dump()
    out: list[object] = [scope]
    for col in CSV_COLUMNS[1:]:
        value = data.get(col)
        out.append("" if value is None else (repr(value) if isinstance(value, float) else value))
    return out


def render_csv(report: Report) -> str:
    """One table: the ``total`` row first (the headline), then one row per group key."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    total = GroupRow(
        key="all",
        tasks_total=report.tasks_total,
        tasks_succeeded=report.tasks_succeeded,
        tasks_succeeded_late=report.tasks_succeeded_late,
        tasks_failed=report.tasks_failed,
        tasks_cancelled=report.tasks_cancelled,
        tasks_running=report.tasks_running,
        calls=report.calls,
        total_cost_usd=report.total_cost_usd,
        gpu_seconds=report.gpu_seconds,
        prompt_tokens=report.prompt_tokens,
        cached_tokens=report.cached_tokens,
        completion_tokens=report.completion_tokens,
        cost_per_successful_task_usd=report.cost_per_successful_task_usd,
        cache_hit_ratio=report.cache_hit_ratio,
    )
    writer.writerow(_csv_row("total", total))
    for row in report.groups:
        writer.writerow(_csv_row(report.group_by, row))
    return buf.getvalue()


# ---- table ---------------------------------------------------------------------------


def table_renderable(report: Report) -> RenderableType:
    """The terminal report: headline, naive figures, tasks, waste, then the chosen grouping."""
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column(justify="right")
    head.add_row("Cost per successful task (fully loaded)", Text(usd(report.cost_per_successful_task_usd), style="bold green"))
    head.add_row("Total cost", usd(report.total_cost_usd))
    head.add_row("Tasks succeeded (within deadline)", count(report.tasks_succeeded))
    head.add_row("Tasks failed", count(report.tasks_failed))
    other = []
    if report.tasks_succeeded_late:
        other.append(f"{report.tasks_succeeded_late} succeeded late")
    if report.tasks_cancelled:
        other.append(f"{report.tasks_cancelled} cancelled")
    if report.tasks_running:
        other.append(f"{report.tasks_running} running")
    if other:
        head.add_row("Other tasks", ", ".join(other))
    head.add_row("Naive: cost per 1M tokens", usd(report.cost_per_million_tokens_usd))
    head.add_row("Naive: cost per request", usd(report.cost_per_request_usd))
    head.add_row("Prefix cache-hit ratio", pct(report.cache_hit_ratio))
    head.add_row("LLM call attempts", count(report.calls))
    if cached := report.calls_by_outcome.get(Outcome.CACHED.value, 0):
        head.add_row("  answered by the response cache (no GPU)", count(cached))

    waste = Table(title="Waste (spend that produced no successful task)", title_justify="left", expand=False)
    waste.add_column("where")
    waste.add_column("USD", justify="right")
    waste.add_column("share of spend", justify="right")
    total = report.total_cost_usd
    for label, value in (
        ("failed / cancelled tasks", report.waste.failed_tasks_usd),
        ("retries (failed attempts)", report.waste.retries_usd),
        ("shed work", report.waste.shed_usd),
        ("prefix-cache misses (est.)", report.waste.cache_miss_usd),
    ):
        waste.add_row(label, usd(value), pct(value / total if total else None))
    waste.add_row(Text("total", style="bold"), usd(report.waste.total_usd), pct(report.waste.share_of_spend))

    parts: list[RenderableType] = [
        Panel(head, title="taskplane cost report", subtitle=window_text(report), expand=False),
    ]
    if report.calls == 0 and report.tasks_total == 0:
        parts.append(Text("No LLM calls or tasks in this window.", style="dim"))
        return Group(*parts)
    return Group(*parts, waste, _groups_table(report), *_failed_table(report))


def _groups_table(report: Report) -> Table:
    """Figures are never cut (a cost shown as ``$0.0008…`` is no figure): their columns do
    not wrap, headings break at set places and a long key folds, so the eight columns fit an
    80-column terminal or CI log (rich's width when output is piped)."""
    groups = Table(title=f"By {report.group_by}", title_justify="left")
    columns: list[tuple[str, Callable[[GroupRow], str]]] = [
        ("suc-\nceeded", lambda r: count(r.tasks_succeeded)),
        ("failed", lambda r: count(r.tasks_failed)),
        ("can-\ncelled", lambda r: count(r.tasks_cancelled)),
        ("calls", lambda r: count(r.calls)),
        ("cost", lambda r: usd(r.total_cost_usd)),
        ("cost per\nsuccessful\ntask", lambda r: usd(r.cost_per_successful_task_usd)),
        ("cache\nhit", lambda r: pct(r.cache_hit_ratio)),
    ]
    groups.add_column(report.group_by, justify="left", overflow="fold", min_width=8)
    for heading, _ in columns:
        groups.add_column(heading, justify="right", no_wrap=True)
    for row in report.groups:
        groups.add_row(row.key, *(cell(row) for _, cell in columns))
    return groups


def _failed_table(report: Report) -> list[RenderableType]:
    if not report.failed_tasks:
        return []
    t = Table(title="Tasks that did not succeed (latest first)", title_justify="left")
    for col in ("task", "agent", "status", "cost"):  # short: kept whole, the error wraps by words
        t.add_column(col, justify="right" if col == "cost" else "left", no_wrap=True)
    t.add_column("error", ratio=1, overflow="fold")
    for f in report.failed_tasks[:20]:
        t.add_row(f.task_id, f.agent, f.status, usd(f.cost_usd), textwrap.shorten(f.error or "", 240, placeholder=" …"))
    return [t]


def render_table(report: Report, width: int = 110) -> str:
    """The table as plain text (for ``--out`` files and tests)."""
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(table_renderable(report))
    return console.file.getvalue()  # type: ignore[attr-defined,no-any-return]


def render(report: Report, fmt: str) -> str:
    """The report in ``fmt`` (table, json, csv or html) as a string."""
    if fmt == "json":
        return render_json(report)
    if fmt == "csv":
        return render_csv(report)
    if fmt == "html":
        from taskplane.reports.html import render_html

        return render_html(report)
    if fmt == "table":
        return render_table(report)
    raise ValueError(f"unknown report format {fmt!r}; use one of {', '.join(FORMATS)}")
