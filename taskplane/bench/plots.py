"""PNG plots of a bench run (matplotlib's object API with the Agg canvas: no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

OURS_COLOR = "#16a34a"
PALETTE = ("#2563eb", "#d97706", "#9333ea", "#dc2626", "#0891b2", "#64748b", "#db2777", "#65a30d")


def _figure(width: float = 7.5, height: float = 4.2) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _colors(names: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    k = 0
    for n in names:
        if n == "taskplane":
            out[n] = OURS_COLOR
        else:
            out[n] = PALETTE[k % len(PALETTE)]
            k += 1
    return out


def _style(ax: Any) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(alpha=0.3)


def ttft_cdf(path: Path, ttfts: dict[str, np.ndarray], title: str) -> Path:
    """Empirical CDF of TTFT (log time axis), one line per policy."""
    fig = _figure()
    ax = fig.add_subplot(111)
    colors = _colors(list(ttfts))
    for name, arr in ttfts.items():
        if arr.size == 0:
            continue
        x = np.sort(np.maximum(arr * 1000.0, 0.1))
        y = np.arange(1, x.size + 1) / x.size
        ax.plot(x, y, label=name, color=colors[name], lw=2.4 if name == "taskplane" else 1.4)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (ms, log scale)")
    ax.set_ylabel("fraction of calls")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    _style(ax)
    fig.savefig(path, bbox_inches="tight")
    return path


def hit_ratio_bars(
    path: Path, policies: dict[str, dict[str, Any]], ceiling: float, title: str, lru: float | None = None
) -> Path:
    """Prefix-hit ratio per policy against the infinite-cache ceiling (and, for traces, the
    hit ratio of one LRU cache as large as the fleet's whole KV memory)."""
    fig = _figure()
    ax = fig.add_subplot(111)
    names = list(policies)
    colors = _colors(names)
    vals = [policies[n].get("prefix_hit_ratio") or 0.0 for n in names]
    bars = ax.bar(names, vals, color=[colors[n] for n in names])
    ax.axhline(ceiling, color="black", ls="--", lw=1)
    ax.text(len(names) - 0.5, ceiling, f" ceiling {ceiling:.1%}", va="bottom", ha="right", fontsize=8)
    if lru is not None:
        ax.axhline(lru, color="#64748b", ls=":", lw=1)
        ax.text(-0.5, lru, f"one LRU of the fleet's KV {lru:.1%} ", va="bottom", ha="left", fontsize=8,
                color="#475569")
    for b, v in zip(bars, vals, strict=True):
        ratio = v / ceiling if ceiling else 0.0
        ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.1%}\n({ratio:.0%})", ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, max([ceiling, *vals]) * 1.2 + 1e-9)
    ax.set_ylabel("prefix-hit ratio (tokens)")
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=25, labelsize=8)
    _style(ax)
    fig.savefig(path, bbox_inches="tight")
    return path


def deadline_vs_load(path: Path, sweep: list[dict[str, Any]], title: str) -> Path:
    """Tasks finished within deadline against offered load, one line per policy."""
    fig = _figure()
    ax = fig.add_subplot(111)
    loads = [p["load"] for p in sweep]
    names = list(sweep[0]["policies"]) if sweep else []
    colors = _colors(names)
    for name in names:
        ys = [(p["policies"].get(name) or {}).get("deadline_met_ratio") for p in sweep]
        ax.plot(loads, [np.nan if y is None else y for y in ys], marker="o", label=name, color=colors[name],
                lw=2.4 if name == "taskplane" else 1.4)
    ax.axvline(1.0, color="black", ls=":", lw=1)
    ax.set_xlabel("offered load (x measured fleet capacity)")
    ax.set_ylabel("tasks finished within deadline")
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.legend(fontsize=8)
    _style(ax)
    fig.savefig(path, bbox_inches="tight")
    return path
