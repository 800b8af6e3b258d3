"""How the report writes numbers for people: money, shares and counts, the same in every format.

A leaf module (nothing of the report imports back), so the renderers and the plots can
all use it without importing one another.
"""

from __future__ import annotations


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
