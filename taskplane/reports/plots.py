"""The HTML report's plots, drawn with matplotlib straight to inline SVG (no files, no network).

Figures are built with ``matplotlib.figure.Figure`` (not pyplot), so rendering is
thread-safe inside the gateway; each plot gets its own SVG id salt so several can
share one page without clashing element ids.
"""

from __future__ import annotations

import io
import re
from datetime import timedelta

from taskplane.reports.formatting import usd
from taskplane.reports.model import GroupRow, Report

COLORS = {"main": "#2563eb", "accent": "#16a34a", "warn": "#dc2626", "muted": "#94a3b8", "amber": "#d97706"}


def _svg(fig: object, salt: str) -> str:
    import matplotlib

    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "none"}):
        buf = io.StringIO()
        fig.savefig(buf, format="svg", bbox_inches="tight")  # type: ignore[attr-defined]
    text = buf.getvalue()
    text = re.sub(r"<\?xml[^>]*\?>\s*", "", text)
    text = re.sub(r"<!DOCTYPE[^>]*>\s*", "", text, flags=re.S)
    return text.replace("<svg ", f'<svg role="img" data-plot="{salt}" ', 1)


def _figure(width: float = 7.5, height: float = 3.2):  # type: ignore[no-untyped-def]
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    fig.patch.set_alpha(0)
    return fig


def _style(ax) -> None:  # type: ignore[no-untyped-def]
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="y", alpha=0.3)
    ax.tick_params(labelsize=8)


def _few_ticks(axis) -> None:  # type: ignore[no-untyped-def]
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(4))


def _usd_ticks(axis) -> None:  # type: ignore[no-untyped-def]
    """Dollar tick labels as the tables print them ($0.000054, not 5.4e-05 with an offset)."""
    from matplotlib.ticker import FuncFormatter

    def short(v: float, _pos: object) -> str:
        text = usd(v)
        return text.rstrip("0").rstrip(".") if "." in text and abs(v) < 1 else text

    axis.set_major_formatter(FuncFormatter(short))


def _dates(ax, report: Report) -> None:  # type: ignore[no-untyped-def]
    import matplotlib.dates as mdates

    if report.timeline:
        pad = timedelta(seconds=report.timeline_bucket_s)
        ax.set_xlim(report.timeline[0].start - pad / 2, report.timeline[-1].start + pad * 1.5)

    # one unambiguous format per span: ConciseDateFormatter mixed "30" (seconds) with "18:38"
    span = (report.timeline[-1].start - report.timeline[0].start) if report.timeline else timedelta(0)
    fmt = "%H:%M:%S" if span < timedelta(minutes=10) else "%H:%M" if span < timedelta(days=2) else "%b %d"
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=3, maxticks=6))
    ax.xaxis.set_major_formatter(mdates.DateFormatter(fmt))


def _empty(ax, message: str = "no data in this window") -> None:  # type: ignore[no-untyped-def]
    ax.text(0.5, 0.5, message, ha="center", va="center", color=COLORS["muted"], transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def cost_over_time(report: Report) -> str:
    """Cost per successful task per time bucket (bars) and cumulative (line)."""
    fig = _figure()
    ax = fig.add_subplot()
    _style(ax)
    pts = report.timeline
    if not pts:
        _empty(ax)
    else:
        xs = [p.start for p in pts]
        width = report.timeline_bucket_s / 86400 * 0.8
        per = [p.cost_per_successful_task_usd or 0.0 for p in pts]
        ax.bar(xs, per, width=width, color=COLORS["main"], alpha=0.45, label="in bucket")
        cum = [p.cumulative_cost_per_successful_task_usd for p in pts]
        ax.plot(xs, [c if c is not None else float("nan") for c in cum], color=COLORS["main"],
                marker="o", markersize=3, label="cumulative")
        if report.cost_per_successful_task_usd is not None:
            ax.axhline(report.cost_per_successful_task_usd, color=COLORS["accent"], linestyle="--",
                       linewidth=1, label="whole window")
        ax.set_ylabel("USD per successful task", fontsize=8)
        _usd_ticks(ax.yaxis)
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        _dates(ax, report)
    ax.set_title("Cost per successful task over time", fontsize=10, loc="left")
    return _svg(fig, "cost-over-time")


def _bars(ax, rows: list[GroupRow], title: str) -> None:  # type: ignore[no-untyped-def]
    _style(ax)
    rows = rows[:12]
    if not rows:
        _empty(ax)
    else:
        labels = [r.key for r in rows][::-1]
        values = [r.cost_per_successful_task_usd or 0.0 for r in rows][::-1]
        colors = [COLORS["main"] if r.cost_per_successful_task_usd is not None else COLORS["warn"] for r in rows][::-1]
        ax.barh(labels, values, color=colors, height=0.6)
        for y, r in enumerate(rows[::-1]):
            value = r.cost_per_successful_task_usd
            note = "no successful task" if value is None else usd(value)
            ax.text(value or 0.0, y, f" {note}", va="center", fontsize=7, color="#111827")
        ax.set_xlim(0, max(values) * 1.35 if max(values) > 0 else 1)
        _few_ticks(ax.xaxis)
        _usd_ticks(ax.xaxis)
        ax.grid(axis="x", alpha=0.3)
        ax.grid(axis="y", visible=False)
        ax.set_xlabel("USD per successful task", fontsize=8)
    ax.set_title(title, fontsize=10, loc="left")


def by_agent_and_tenant(report: Report) -> str:
    fig = _figure(height=max(2.6, 0.35 * max(len(report.groups_by.get("agent", [])), len(report.groups_by.get("tenant", [])), 1) + 1.2))
    _bars(fig.add_subplot(1, 2, 1), report.groups_by.get("agent", []), "By agent")
    _bars(fig.add_subplot(1, 2, 2), report.groups_by.get("tenant", []), "By tenant")
    fig.tight_layout()
    return _svg(fig, "by-agent-tenant")


def waste_breakdown(report: Report) -> str:
    fig = _figure(height=2.6)
    ax = fig.add_subplot()
    _style(ax)
    w = report.waste
    parts = [
        ("useful", max(report.total_cost_usd - w.total_usd, 0.0), COLORS["accent"]),
        ("failed tasks", w.failed_tasks_usd, COLORS["warn"]),
        ("retries", w.retries_usd, COLORS["amber"]),
        ("shed", w.shed_usd, COLORS["muted"]),
        ("cache misses (est.)", w.cache_miss_usd, COLORS["main"]),
    ]
    if report.total_cost_usd <= 0:
        _empty(ax)
    else:
        labels = [p[0] for p in parts][::-1]
        values = [p[1] for p in parts][::-1]
        ax.barh(labels, values, color=[p[2] for p in parts][::-1])
        for y, v in enumerate(values):
            ax.text(v, y, f" {usd(v)} ({v / report.total_cost_usd:.0%})", va="center", fontsize=7)
        ax.set_xlim(0, max(values) * 1.3 if max(values) > 0 else 1)
        _few_ticks(ax.xaxis)
        _usd_ticks(ax.xaxis)
        ax.grid(axis="x", alpha=0.3)
        ax.grid(axis="y", visible=False)
        ax.set_xlabel("USD", fontsize=8)
    ax.set_title("Where the money went", fontsize=10, loc="left")
    return _svg(fig, "waste")


def cache_hit_over_time(report: Report) -> str:
    fig = _figure(height=2.6)
    ax = fig.add_subplot()
    _style(ax)
    pts = [p for p in report.timeline if p.cache_hit_ratio is not None]
    if not pts:
        _empty(ax)
    else:
        ax.plot([p.start for p in pts], [p.cache_hit_ratio * 100 for p in pts if p.cache_hit_ratio is not None],
                color=COLORS["main"], marker="o", markersize=3, label="in bucket")
        if report.cache_hit_ratio is not None:
            ax.axhline(report.cache_hit_ratio * 100, color=COLORS["accent"], linestyle="--", linewidth=1,
                       label="whole window")
        ax.set_ylim(0, 100)
        ax.set_ylabel("% prompt tokens from cache", fontsize=8)
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        _dates(ax, report)
    ax.set_title("Prefix cache-hit ratio", fontsize=10, loc="left")
    return _svg(fig, "cache-hit")
