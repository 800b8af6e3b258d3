"""results.json, results.md and the terminal table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table

#: (key, header, format) of the columns shown in the table and the Markdown file
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p90_ms", "p90", "{:.0f}"),
    ("ttft_p99_ms", "p99", "{:.0f}"),
    ("call_e2e_p50_ms", "call e2e p50 ms", "{:.0f}"),
    ("call_e2e_p99_ms", "p99", "{:.0f}"),
    ("task_e2e_p50_s", "task e2e p50 s", "{:.1f}"),
    ("task_e2e_p99_s", "p99", "{:.1f}"),
    ("prefix_hit_ratio", "prefix hits", "{:.1%}"),
    ("hit_ceiling_ratio", "/ ceiling", "{:.0%}"),
    ("deadline_met_ratio", "tasks in deadline", "{:.1%}"),
    ("goodput_tasks_per_gpu_hour", "goodput tasks/GPU-h", "{:.1f}"),
    ("gpu_seconds", "GPU-s", "{:,.0f}"),
    ("cost_per_successful_task_usd", "$/successful task", "{:.4f}"),
    ("fleet_cost_per_successful_task_usd", "fleet $/task", "{:.4f}"),
    ("sheds", "sheds", "{:d}"),
    ("retries", "retries", "{:d}"),
    ("decision_p50_us", "decision p50 µs", "{:.0f}"),
    ("decision_p99_us", "p99 µs", "{:.0f}"),
    ("decision_cpu_p99_us", "p99 µs CPU", "{:.0f}"),
)


def fmt(value: Any, spec: str) -> str:
    if value is None:
        return "–"
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


#: the terminal's narrower choice (results.md has every column)
TERMINAL: tuple[tuple[str, str, str], ...] = (
    ("ttft_p50_ms", "TTFT p50\nms", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99\nms", "{:.0f}"),
    ("prefix_hit_ratio", "prefix\nhits", "{:.1%}"),
    ("hit_ceiling_ratio", "of\nceiling", "{:.0%}"),
    ("deadline_met_ratio", "tasks in\ndeadline", "{:.1%}"),
    ("goodput_tasks_per_gpu_hour", "goodput\n/GPU-h", "{:.1f}"),
    ("cost_per_successful_task_usd", "$ per\nsucc. task", "{:.4f}"),
    ("sheds", "sheds", "{:d}"),
    ("retries", "retries", "{:d}"),
    ("decision_p99_us", "decide\np99 µs", "{:.0f}"),
)


def rich_table(title: str, policies: dict[str, dict[str, Any]]) -> Table:
    table = Table(title=title, show_lines=False, header_style="bold")
    table.add_column("policy", style="bold", no_wrap=True)
    for _, header, _ in TERMINAL:
        table.add_column(header, justify="right", no_wrap=True)
    for name, m in policies.items():
        style = "green" if name == "taskplane" else None
        table.add_row(name, *(fmt(m.get(k), f) for k, _, f in TERMINAL), style=style)
    return table


def markdown_table(policies: dict[str, dict[str, Any]]) -> str:
    head = "| policy | " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    sep = "|---|" + "|".join("---:" for _ in COLUMNS) + "|"
    rows = [f"| {name} | " + " | ".join(fmt(m.get(k), f) for k, _, f in COLUMNS) + " |"
            for name, m in policies.items()]
    return "\n".join([head, sep, *rows])


def targets_markdown(targets: list[dict[str, Any]]) -> str:
    if not targets:
        return ""
    lines = ["| target | taskplane | best baseline | ratio | met |", "|---|---:|---|---:|:---:|"]
    for t in targets:
        base = "–" if t["best_baseline"] is None else f"{t['best_baseline']} ({_num(t['baseline'])})"
        lines.append(f"| {t['target']} | {_num(t['taskplane'])} | {base} | {_num(t['ratio'])} | "
                     f"{'yes' if t['met'] else 'no'} |")
    return "\n".join(lines)


def _num(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def results_markdown(results: dict[str, Any]) -> str:
    """The Markdown page of one bench run."""
    out = [f"# taskplane bench: {results['workload']}", ""]
    out.append(f"- fleet: {results['fleet']} ({results['replicas']} replicas), seed {results['seed']}, "
               f"time scale {results['time_scale']}")
    info = results.get("workload_info", {})
    if info:
        out.append("- workload: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    cap = results.get("capacity")
    if cap:
        out.append(f"- measured capacity: {cap['tasks_per_s']:.3f} tasks/s: the highest rate at which the best "
                   f"baseline ({cap['reference_policy']}) finishes >= {cap['slo_attainment']:.0%} of tasks "
                   f"within deadline, arrivals over {cap['window_s']:.0f} s ({len(cap['probes'])} probe runs)")
    out.append(f"- infinite-cache hit ceiling: {results['hit_ceiling']:.1%}")
    if results.get("hit_lru_bound") is not None:
        out.append(f"- one LRU cache as large as the fleet's whole KV memory hits {results['hit_lru_bound']:.1%} "
                   f"({results['hit_lru_bound'] / results['hit_ceiling']:.0%} of the ceiling)")
    out.append(f"- machine: {results['machine'].get('cpu_model')} ({results['machine'].get('nproc')} cores)")
    out.append(f"- command: `{results.get('command', '')}`")
    out.append("")
    sweep = results.get("sweep") or []
    if len(sweep) > 1:
        for point in sweep:
            out.append(f"## load {point['load']}x ({point['arrival_rate_per_s']:.3f} tasks/s, "
                       f"ceiling {point['hit_ceiling']:.1%})")
            out.append("")
            out.append(markdown_table(point["policies"]))
            out.append("")
    else:
        out.append(markdown_table(results["policies"]))
        out.append("")
    if results.get("targets"):
        head = "## targets" + (f" (load {results['load']}x)" if results.get("load") is not None else "")
        out.extend([head, "", targets_markdown(results["targets"]), ""])
    return "\n".join(out)


def write_results(out: Path, results: dict[str, Any]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    js = out / "results.json"
    js.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    md = out / "results.md"
    md.write_text(results_markdown(results), encoding="utf-8")
    return js, md
