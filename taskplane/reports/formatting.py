"""How the report's figures are written for people (money, shares, counts, the window).

Shared by every face of the report (terminal table, HTML), so they agree to the digit
shown; its own module so that the HTML page and the format dispatcher in
:mod:`taskplane.reports.render` need not import each other.
"""

from __future__ import annotations

from taskplane.reports.model import Report


def usd(value: float | None) -> str:
    """Money for people: cents for large sums, micro-dollars for small ones."""
    if value is None:
        return "n/a"
    if abs(value) >= 1000:
        return f"${value:,.2f}"
    if abs(value) >= 1:
        return f"${value:,.4f}"
    return f"${value:.6f}"


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


def count(value: int) -> str:
    return f"{value:,}"


def window_text(report: Report) -> str:
    since = report.since.isoformat() if report.since else "the beginning"
    until = report.until.isoformat() if report.until else "now"
    scope = f"tenant {report.tenant}" if report.tenant else "all tenants"
    return f"{since} to {until}, {scope}"
