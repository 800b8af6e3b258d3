"""``taskplane bench --matrix``: every decision family over held-out variations, one table.

A win tuned on one workload is worth little until it holds where nobody tuned: other
seeds, other fleet sizes, slow cold starts, hints absent or wrong, a second trace. The
matrix runs each decision family (placement under overload, KV tiers on a trace replay,
autoscaling over a day) on a set of such cells, each cell an ordinary ``taskplane bench``
run written to its own directory, and prints per cell the ratio of taskplane's figure to
the best simple baseline's, oriented so that above 1.0 is better for taskplane.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from taskplane.bench.targets import OURS, best_baseline
from taskplane.errors import UserError

#: the worst ratio a cell may show before the matrix calls it a loss
FLOOR = 0.97


@dataclass(frozen=True)
class Family:
    """A decision family: which bench runs it and which figure decides a cell."""

    name: str
    workload: str
    metric: str  # a key of each policy's (or autoscaler's) results
    what: str  # the figure, in words
    lower_is_better: bool
    section: str = "policies"  # where results.json keeps the compared entries
    defaults: dict[str, Any] = field(default_factory=dict)  # BenchOptions fields of every cell


PLACEMENT = Family("placement", "agents", "deadline_met_ratio", "tasks within deadline at 1.3x load",
                   lower_is_better=False, defaults={"load": "1.3", "replicas": 4})
KV_TIERS = Family("kv-tiers", "mooncake", "ttft_p50_ms", "TTFT p50, 256 GB host tier", lower_is_better=True,
                  defaults={"host_kv_gb": 256.0, "replicas": 16})
AUTOSCALE = Family("autoscale", "diurnal", "goodput_per_gpu_hour", "goodput per GPU-hour over a day",
                   lower_is_better=False, section="autoscalers", defaults={"replicas": 4})


@dataclass(frozen=True)
class Cell:
    """One run: a family with some of its defaults varied."""

    family: Family
    label: str
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return f"{self.family.name}-" + "".join(c if c.isalnum() else "-" for c in self.label).strip("-")

    def bench_args(self, out: Path) -> dict[str, Any]:
        return {"workload": self.family.workload, **self.family.defaults, **self.args, "out": out / self.slug}


def cells(second_trace: Path) -> list[Cell]:
    """The held-out variations, one factor at a time around each family's defaults."""
    out: list[Cell] = []
    for seed in (1, 2, 3):
        out.append(Cell(PLACEMENT, f"seed {seed}", {"seed": seed}))
    out.append(Cell(PLACEMENT, "16 replicas", {"replicas": 16}))
    out.append(Cell(KV_TIERS, "conversation trace", {}))
    out.append(Cell(KV_TIERS, "4 replicas", {"replicas": 4}))
    out.append(Cell(KV_TIERS, "tool-agent trace", {"trace": second_trace}))
    for hints in ("none", "noisy", "exact"):  # the default is the author's hints; exact is the oracle bound
        out.append(Cell(PLACEMENT, f"hints {hints}", {"hints": hints}))
        out.append(Cell(KV_TIERS, f"hints {hints}", {"hints": hints}))
    for seed in (1, 2, 3):
        out.append(Cell(AUTOSCALE, f"seed {seed}", {"seed": seed}))
    out.append(Cell(AUTOSCALE, "16 replicas", {"replicas": 16}))
    for cold in (18.0, 120.0):
        out.append(Cell(AUTOSCALE, f"cold start {cold:g} s", {"cold_start_s": cold}))
    out.append(Cell(AUTOSCALE, "hints none", {"hints": "none"}))
    return out


def score(family: Family, results: dict[str, Any]) -> dict[str, Any]:
    """taskplane against the best other entry on the family's figure, from one results.json."""
    entries: dict[str, dict[str, Any]] = results.get(family.section) or {}
    ours = entries.get(OURS, {}).get(family.metric)
    best = best_baseline(entries, family.metric, family.lower_is_better)
    if ours is None or best is None:
        return {"taskplane": ours, "baseline": None, "best_baseline": None, "ratio": None}
    name, value = best
    if family.lower_is_better:
        ratio = value / ours if ours else float("inf")
    else:
        ratio = ours / value if value else float("inf")
    return {"taskplane": ours, "baseline": value, "best_baseline": name, "ratio": round(ratio, 3)}


def run_matrix(out: Path, *, only: str | None = None) -> dict[str, Any]:
    """Run every cell (or those whose name contains ``only``); writes matrix.json and matrix.md."""
    from taskplane.bench.tracegen import ToolAgentShape, write_trace

    out.mkdir(parents=True, exist_ok=True)
    trace = out / "toolagent.jsonl"
    if not trace.is_file():
        write_trace(trace, ToolAgentShape(), seed=1)
    every = cells(trace)
    chosen = [c for c in every if only is None or only in c.slug]
    if not chosen:
        raise UserError(f"--matrix-cells {only!r} matches no cell; the cells: {', '.join(c.slug for c in every)}")
    return run_cells(out, chosen)


def run_cells(out: Path, chosen: Sequence[Cell]) -> dict[str, Any]:
    """Each cell an ordinary bench run in its own directory, then the one table of ratios."""
    from taskplane.bench.command import run_bench
    from taskplane.bench.options import BenchOptions

    console = Console()
    rows: list[dict[str, Any]] = []
    for i, cell in enumerate(chosen, 1):
        console.rule(f"[bold]matrix cell {i}/{len(chosen)}: {cell.family.name} · {cell.label}")
        results = run_bench(BenchOptions(**cell.bench_args(out)))
        rows.append({"family": cell.family.name, "cell": cell.label, "figure": cell.family.what,
                     "metric": cell.family.metric, "dir": cell.slug, **score(cell.family, results)})
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    doc = {"floor": FLOOR, "cells": rows, "worst_ratio": min(ratios, default=None),
           "below_floor": sum(1 for r in ratios if r < FLOOR)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "matrix.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "matrix.md").write_text(markdown(rows) + "\n")
    console.print(terminal_table(rows))
    console.print(f"wrote {out / 'matrix.json'}, {out / 'matrix.md'}")
    return doc


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _ratio_text(ratio: float | None) -> str:
    if ratio is None:
        return "n/a"
    return f"{ratio:.3f}" + ("" if ratio >= FLOOR else " (below floor)")


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| family | cell | figure | taskplane | best simple baseline | ratio (>1 better) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['cell']} | {r['figure']} | {_figure(r['taskplane'])} | "
                     f"{r['best_baseline']} {_figure(r['baseline'])} | {_ratio_text(r['ratio'])} |")
    return "\n".join(lines)


def terminal_table(rows: Sequence[dict[str, Any]]) -> Table:
    table = Table(title=f"robustness matrix: taskplane / best simple baseline (floor {FLOOR})")
    for col in ("family", "cell", "figure", "taskplane", "best baseline", "ratio"):
        table.add_column(col)
    for r in rows:
        ratio = r["ratio"]
        style = "green" if ratio is not None and ratio >= FLOOR else "red"
        table.add_row(r["family"], r["cell"], r["figure"], _figure(r["taskplane"]),
                      f"{r['best_baseline']} {_figure(r['baseline'])}", f"[{style}]{_ratio_text(ratio)}[/]")
    return table
