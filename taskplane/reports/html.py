"""The HTML report: one self-contained file (inline CSS, inline SVG plots, the JSON embedded).

Headline figures carry an element id and a ``data-value`` with the exact number, so a
browser test (or a script) can check them against the JSON report; the page needs no
network and no JavaScript to render.
"""

from __future__ import annotations

import html
import json
import os
import threading
from urllib.parse import quote

from taskplane.reports import plots
from taskplane.reports.formatting import count, pct, usd, window_text
from taskplane.reports.model import Report
from taskplane.store.records import Outcome

_PLOT_LOCK = threading.Lock()

CSS = """
:root { --fg:#0f172a; --muted:#64748b; --line:#e2e8f0; --accent:#16a34a; --bg:#f8fafc; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
       background: var(--bg); margin: 0; padding: 24px; }
main { max-width: 1100px; margin: 0 auto; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 28px 0 8px; }
.sub { color: var(--muted); margin-bottom: 18px; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr)); gap: 12px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 12px 14px; }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
.card .value { font-size: 22px; font-weight: 650; margin-top: 2px; }
.card.headline { border: 2px solid var(--accent); }
.card.headline .value { color: var(--accent); font-size: 28px; }
.card.naive .value { color: var(--muted); }
table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid var(--line); }
th, td { padding: 6px 10px; border-bottom: 1px solid var(--line); text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f1f5f9; font-weight: 600; font-size: 12px; }
td.err { text-align: left; font-size: 12px; color: #7f1d1d; }
.plots { display: grid; grid-template-columns: 1fr; gap: 14px; }
figure.plot { margin: 0; background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 10px; }
figure.plot svg { width: 100%; height: auto; display: block; }
.note { color: var(--muted); font-size: 12px; }
"""


def _num(value: float | int | None) -> str:
    return "" if value is None else repr(value)


def _figure_value(elem_id: str, label: str, text: str, value: float | int | None, cls: str = "") -> str:
    return (
        f'<div class="card {cls}"><div class="label">{html.escape(label)}</div>'
        f'<div class="value" id="{elem_id}" data-value="{_num(value)}">{html.escape(text)}</div></div>'
    )


def _groups_table(report: Report, dimension: str) -> str:
    rows = report.groups_by.get(dimension, [])
    head = (
        f"<tr><th>{html.escape(dimension)}</th><th>succeeded</th><th>failed</th><th>cancelled</th><th>calls</th>"
        "<th>cost</th><th>cost / successful task</th><th>cache hit</th></tr>"
    )
    body = "".join(
        f'<tr data-key="{html.escape(r.key)}"><td>{html.escape(r.key)}</td><td>{count(r.tasks_succeeded)}</td>'
        f"<td>{count(r.tasks_failed)}</td><td>{count(r.tasks_cancelled)}</td><td>{count(r.calls)}</td>"
        f"<td>{usd(r.total_cost_usd)}</td>"
        f'<td data-value="{_num(r.cost_per_successful_task_usd)}">{usd(r.cost_per_successful_task_usd)}</td>'
        f"<td>{pct(r.cache_hit_ratio)}</td></tr>"
        for r in rows
    )
    return f'<table id="groups-{html.escape(dimension)}">{head}{body}</table>'


def _waste_table(report: Report) -> str:
    w, total = report.waste, report.total_cost_usd
    rows = [
        ("waste-failed-tasks", "failed / cancelled tasks", w.failed_tasks_usd),
        ("waste-retries", "retries (failed attempts)", w.retries_usd),
        ("waste-shed", "shed work", w.shed_usd),
        ("waste-cache-miss", "prefix-cache misses (estimated)", w.cache_miss_usd),
        ("waste-total", "total waste", w.total_usd),
    ]
    body = "".join(
        f'<tr><td>{html.escape(label)}</td><td id="{eid}" data-value="{_num(v)}">{usd(v)}</td>'
        f"<td>{pct(v / total if total else None)}</td></tr>"
        for eid, label, v in rows
    )
    return f'<table id="waste"><tr><th>where</th><th>USD</th><th>share of spend</th></tr>{body}</table>'


def _failed_table(report: Report, temporal_ui_url: str | None) -> str:
    """The tasks that did not succeed, each with its error and a link to it in the Temporal UI."""
    if not report.failed_tasks:
        return '<p class="note" id="failed-tasks">No failed or cancelled tasks in this window.</p>'
    ui = (temporal_ui_url or "").rstrip("/")

    def task_cell(task_id: str) -> str:
        if not ui:
            return html.escape(task_id)
        href = f"{ui}/namespaces/default/workflows/{quote(task_id, safe='')}"
        return f'<a href="{html.escape(href)}">{html.escape(task_id)}</a>'

    body = "".join(
        f'<tr data-task="{html.escape(f.task_id)}"><td>{task_cell(f.task_id)}</td><td>{html.escape(f.agent)}</td>'
        f"<td>{html.escape(f.tenant)}</td><td>{html.escape(f.status)}</td><td>{usd(f.cost_usd)}</td>"
        f'<td class="err">{html.escape(" ".join((f.error or "").split())[:300])}</td></tr>'
        for f in report.failed_tasks
    )
    head = "<tr><th>task</th><th>agent</th><th>tenant</th><th>status</th><th>cost</th><th>error</th></tr>"
    return f'<table id="failed-tasks">{head}{body}</table>'


def _cards(report: Report) -> str:
    """The headline figures, the fully loaded one first and the naive ones beside it."""
    return "".join(
        [
            _figure_value("cost-per-successful-task", "Cost per successful task (fully loaded)",
                          usd(report.cost_per_successful_task_usd), report.cost_per_successful_task_usd, "headline"),
            _figure_value("total-cost", "Total cost", usd(report.total_cost_usd), report.total_cost_usd),
            _figure_value("tasks-succeeded", "Tasks succeeded (within deadline)", count(report.tasks_succeeded),
                          report.tasks_succeeded),
            _figure_value("tasks-failed", "Tasks failed", count(report.tasks_failed), report.tasks_failed),
            _figure_value("cost-per-million-tokens", "Naive: cost per 1M tokens",
                          usd(report.cost_per_million_tokens_usd), report.cost_per_million_tokens_usd, "naive"),
            _figure_value("cost-per-request", "Naive: cost per request", usd(report.cost_per_request_usd),
                          report.cost_per_request_usd, "naive"),
            _figure_value("cache-hit-ratio", "Prefix cache-hit ratio", pct(report.cache_hit_ratio),
                          report.cache_hit_ratio),
            _figure_value("waste-share", "Waste share of spend", pct(report.waste.share_of_spend),
                          report.waste.share_of_spend),
        ]
    )


def _other_tasks(report: Report) -> str:
    """The tasks and calls the cards do not show."""
    cached = report.calls_by_outcome.get(Outcome.CACHED.value, 0)
    return (
        f"{count(report.tasks_succeeded_late)} succeeded late, {count(report.tasks_cancelled)} cancelled, "
        f"{count(report.tasks_running)} still running; {count(report.calls)} LLM call attempts"
        + (f", {count(cached)} of them answered by the response cache." if cached else ".")
    )


def _figures(report: Report) -> str:
    with _PLOT_LOCK:  # matplotlib's rc settings are process-global
        drawn = (
            ("cost-over-time", plots.cost_over_time(report)),
            ("by-agent-tenant", plots.by_agent_and_tenant(report)),
            ("waste", plots.waste_breakdown(report)),
            ("cache-hit", plots.cache_hit_over_time(report)),
        )
    return "".join(f'<figure class="plot" id="plot-{name}">{svg}</figure>' for name, svg in drawn)


def render_html(report: Report, temporal_ui_url: str | None = None) -> str:
    """The whole report as one HTML document.

    Failed tasks link to ``temporal_ui_url`` (default ``TASKPLANE_TEMPORAL_UI_URL``).
    """
    temporal_ui_url = temporal_ui_url or os.environ.get("TASKPLANE_TEMPORAL_UI_URL")
    cards, other, figures = _cards(report), _other_tasks(report), _figures(report)
    data = json.dumps(report.to_json_dict()).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>taskplane cost report</title>
<style>{CSS}</style>
</head>
<body>
<main>
<h1>Cost per successful task</h1>
<div class="sub">{html.escape(window_text(report))} · generated {html.escape(report.generated_at.isoformat(timespec="seconds"))}</div>
<section class="cards" id="headline">{cards}</section>
<p class="note">Fully loaded: all spend in the window (failed tasks, retries and shed work included) divided by the
tasks that succeeded within their deadline. {html.escape(other)}</p>
<h2>Plots</h2>
<section class="plots">{figures}</section>
<h2>Waste</h2>
{_waste_table(report)}
<h2>By agent</h2>
{_groups_table(report, "agent")}
<h2>By tenant</h2>
{_groups_table(report, "tenant")}
<h2>By model</h2>
{_groups_table(report, "model")}
<h2>By GPU</h2>
{_groups_table(report, "gpu")}
<h2>By adapter</h2>
{_groups_table(report, "adapter")}
<h2>Tasks that did not succeed</h2>
{_failed_table(report, temporal_ui_url)}
<p class="note">Model, GPU and adapter rows count a task in every group its calls touched. Cache-miss waste is an estimate:
the prefill share of a call's cost for context its session had already built (see docs/costs.md).</p>
<script type="application/json" id="report-json">{data}</script>
</main>
</body>
</html>
"""
