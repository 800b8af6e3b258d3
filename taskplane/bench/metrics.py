"""One policy's benchmark figures, computed from a simulated run's records.

Cost figures come from :func:`taskplane.reports.compute.build_report` over the same
``AttemptRecord`` / ``TaskRecord`` rows the gateway writes to Postgres, so a benchmark
and a live ``taskplane report`` define "cost per successful task" identically: all
attempt spend (failed tasks, retries and shed work included) over tasks that succeeded
within their deadline. The fleet figures next to it charge every replica for the whole
run, idle time included (what a fixed fleet really costs).

Latencies are per *call* as the caller sees it: from the first time the call was offered
to the scheduler (admission queueing, sheds and retries included) to its first token and
to its last token of the successful attempt.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from taskplane.reports.compute import build_report
from taskplane.reports.model import Report
from taskplane.sim.cluster import ClusterResult, TaskResult
from taskplane.store.records import Outcome, TaskStatus

#: fields measured on the wall clock: they differ between two runs of the same seed
WALL_CLOCK_FIELDS: frozenset[str] = frozenset(
    {"decision_p50_us", "decision_p90_us", "decision_p99_us", "decision_mean_us", "decision_cpu_p50_us",
     "decision_cpu_p99_us", "wall_s", "cpu_s"}
)


def percentile(values: Iterable[float], q: float, scale: float = 1.0) -> float | None:
    """The ``q``-th percentile times ``scale`` (None for no values)."""
    arr = np.fromiter(values, dtype=np.float64)
    if arr.size == 0:
        return None
    return float(np.percentile(arr, q)) * scale


def task_figures(tasks: Sequence[TaskResult]) -> dict[str, Any]:
    """The task counts of a run, by the one rule of both benches: a task succeeded when
    every call was answered and it finished within its deadline (if it had one)."""
    met = [t for t in tasks if t.status is TaskStatus.SUCCEEDED and t.deadline_met is not False]
    task_e2e = [t.finished_s - t.arrival_s for t in met if t.finished_s is not None]
    return {"tasks": len(tasks), "tasks_succeeded": len(met),
            "deadline_met_ratio": len(met) / len(tasks) if tasks else None,
            "task_e2e_p50_s": percentile(task_e2e, 50), "task_e2e_p99_s": percentile(task_e2e, 99)}


def _round(x: Any, nd: int = 4) -> Any:
    if isinstance(x, float):
        return round(x, nd) if abs(x) >= 1e-3 or x == 0 else float(f"{x:.4g}")
    return x


def call_latencies(result: ClusterResult) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT, end-to-end) in seconds of every successful call, from its first offer."""
    calls = result.calls
    first_offer: dict[tuple[str, int], float] = {}
    for c in calls:
        key = (c.task_id, c.step)
        t = first_offer.get(key)
        if t is None or c.offered_s < t:
            first_offer[key] = c.offered_s
    ttft: list[float] = []
    e2e: list[float] = []
    for c in calls:
        if c.outcome is Outcome.SUCCESS and c.first_token_s is not None:
            t0 = first_offer[(c.task_id, c.step)]
            ttft.append(c.first_token_s - t0)
            e2e.append(c.finished_s - t0)
    return np.asarray(ttft, dtype=np.float64), np.asarray(e2e, dtype=np.float64)


def policy_metrics(
    result: ClusterResult,
    *,
    hit_ceiling: float,
    decision_ns: Iterable[int] | None = None,
    wall_s: float | None = None,
    latencies: tuple[np.ndarray, np.ndarray] | None = None,
    decision_cpu_ns: Iterable[int] | None = None,
    cpu_s: float | None = None,
) -> dict[str, Any]:
    """Every figure of one run (JSON-able; None where there is nothing to measure)."""
    ttft, e2e = latencies if latencies is not None else call_latencies(result)
    task = task_figures(result.tasks)
    report = build_report(result.attempt_records(), result.task_records())
    dec = np.fromiter(decision_ns if decision_ns is not None else result.decision_ns, dtype=np.float64)
    dcpu = np.fromiter(decision_cpu_ns if decision_cpu_ns is not None else (), dtype=np.float64)
    out: dict[str, Any] = {
        **_served(result, report, task, ttft, e2e),
        **_spend(result, report, task["tasks_succeeded"], hit_ceiling),
        **_failures(result, report),
        **_decisions(dec, dcpu),
        "makespan_s": result.end_s,
        "wall_s": wall_s,
        "cpu_s": None if cpu_s is None else round(cpu_s, 2),
    }
    return {k: _round(v) for k, v in out.items()}


def _served(result: ClusterResult, report: Report, task: dict[str, Any], ttft: np.ndarray,
            e2e: np.ndarray) -> dict[str, Any]:
    """Calls and tasks served, deadlines met, and the latencies."""
    calls = result.calls
    return {
        "calls": len({(c.task_id, c.step) for c in calls}),
        "attempts": len(calls),
        "calls_ok": int(report.calls_by_outcome.get(Outcome.SUCCESS.value, 0)),
        "tasks": task["tasks"],
        "tasks_succeeded": task["tasks_succeeded"],
        "tasks_late": report.tasks_succeeded_late,
        "tasks_failed": report.tasks_failed,
        "tasks_unfinished": report.tasks_running,
        "deadline_met_ratio": task["deadline_met_ratio"],
        "ttft_p50_ms": percentile(ttft, 50, 1000.0),
        "ttft_p90_ms": percentile(ttft, 90, 1000.0),
        "ttft_p99_ms": percentile(ttft, 99, 1000.0),
        "ttft_mean_ms": float(np.mean(ttft)) * 1000.0 if ttft.size else None,
        "call_e2e_p50_ms": percentile(e2e, 50, 1000.0),
        "call_e2e_p99_ms": percentile(e2e, 99, 1000.0),
        "task_e2e_p50_s": task["task_e2e_p50_s"],
        "task_e2e_p99_s": task["task_e2e_p99_s"],
    }


def _spend(result: ClusterResult, report: Report, n_met: int, hit_ceiling: float) -> dict[str, Any]:
    """The prefix cache's share, GPU time and what it cost, per successful task too."""
    fleet_s = result.fleet_gpu_seconds
    busy_s = sum(r.busy_s for r in result.replicas)
    fleet_cost = result.fleet_cost_usd
    prefix = report.cache_hit_ratio or 0.0
    return {
        "prefix_hit_ratio": prefix,
        "hit_ceiling_ratio": prefix / hit_ceiling if hit_ceiling > 0 else None,
        "gpu_seconds": report.gpu_seconds,
        "busy_gpu_seconds": busy_s,
        "fleet_gpu_seconds": fleet_s,
        "gpu_busy_ratio": busy_s / fleet_s if fleet_s else None,
        "goodput_tasks_per_gpu_hour": n_met / (fleet_s / 3600.0) if fleet_s else None,
        "total_cost_usd": report.total_cost_usd,
        "cost_per_successful_task_usd": report.cost_per_successful_task_usd,
        "fleet_cost_usd": fleet_cost,
        "fleet_cost_per_successful_task_usd": fleet_cost / n_met if n_met else None,
        "cost_per_million_tokens_usd": report.cost_per_million_tokens_usd,
        "waste_share": report.waste.share_of_spend,
    }


def _failures(result: ClusterResult, report: Report) -> dict[str, Any]:
    """Calls shed, retried, refused as unmeetable, timed out or failed at a replica."""
    outcomes = report.calls_by_outcome
    errors = [c.error_type for c in result.calls if c.outcome is not Outcome.SUCCESS]
    return {
        "sheds": int(outcomes.get(Outcome.SHED.value, 0)),
        "retries": sum(t.retries for t in result.tasks),
        "unmeetable": sum(1 for e in errors if e == "deadline_unmeetable"),
        "timeouts": int(outcomes.get(Outcome.TIMEOUT.value, 0)),
        "replica_errors": sum(1 for e in errors if e == "replica_error"),
    }


def _decisions(dec: np.ndarray, dcpu: np.ndarray) -> dict[str, Any]:
    """The placement decisions' count and wall (and CPU) time, in microseconds."""
    return {
        "decisions": int(dec.size),
        "decision_p50_us": float(np.percentile(dec, 50)) / 1000.0 if dec.size else None,
        "decision_p90_us": float(np.percentile(dec, 90)) / 1000.0 if dec.size else None,
        "decision_p99_us": float(np.percentile(dec, 99)) / 1000.0 if dec.size else None,
        "decision_mean_us": float(dec.mean()) / 1000.0 if dec.size else None,
        "decision_cpu_p50_us": float(np.percentile(dcpu, 50)) / 1000.0 if dcpu.size else None,
        "decision_cpu_p99_us": float(np.percentile(dcpu, 99)) / 1000.0 if dcpu.size else None,
    }
