"""What the scale bench (:mod:`taskplane.bench.scale`) measured, and how it is written down.

A cell's measures (:class:`CellRun`, sent back from the cell's process), the KV index's
size, and the run's figures: summed over cells (rates, rows, index entries) or merged
(decision times) into ``scale.json`` and its table in ``scale.md``. Apart from running
the cells so that scale.py stays the simulation and this the accounting.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from taskplane.bench.machine import machine_info
from taskplane.scheduler.kvindex import KVIndex

#: Temporal history events per activity (ActivityTaskScheduled/Started/Completed plus the
#: workflow task that reacts: WorkflowTaskScheduled/Started/Completed) and per workflow
#: (WorkflowExecutionStarted/Completed plus its first workflow task)
EVENTS_PER_ACTIVITY = 6
EVENTS_PER_WORKFLOW = 5
_INT_BYTES = 36  # a CPython int holding a 64-bit hash (sys.getsizeof(2**63))


@dataclass(frozen=True, kw_only=True)
class ScaleRun:
    """One fleet-scale run: the fleet, the tasks and their arrival rate, the policy, the cells."""

    replicas: int = 1000
    tasks: int = 100_000
    rate: float | None = None  # task arrivals per second; None: 0.15 per replica
    policy: str = "taskplane"
    gpu: str = "h100"
    seed: int = 1
    cells: int = 1  # each with its own scheduler and process

    @property
    def arrival_rate(self) -> float:
        return self.rate if self.rate is not None else 0.15 * self.replicas


@dataclass(slots=True)
class CellRun:
    """What one cell's simulation measured (picklable: cells run in child processes)."""

    replicas: int
    tasks: int
    attempts: int
    calls: int
    calls_ok: int
    sheds: int
    tasks_finished: int
    tasks_within_deadline: int
    prompt_tokens: int
    cached_tokens: int
    virtual_s: float
    activities: int
    kv_batches: int
    kv_events: int
    blocks_stored: int
    blocks_removed: int
    kv_index: dict[str, Any]
    decision_ns: np.ndarray
    decision_cpu_ns: np.ndarray
    simulate_wall_s: float
    simulate_cpu_s: float
    peak_rss_mb: float
    block_size: int


def kv_index_size(index: KVIndex) -> dict[str, Any]:
    """Entries of the scheduler's KV index and an estimate of their memory.

    The precise index holds a dict block -> owner bitmask (an int of one bit per replica
    id; a block with one owner shares that replica's one-bit int) and, per replica, a dict
    engine hash -> our hash and the set of its blocks (the one-replica walk probes it). Sizes
    are CPython's: the dicts' and sets' tables (``sys.getsizeof``) plus the int objects they
    reference (a set shares its keys with the owner dict)."""
    precise = index.precise
    owners = precise.owners
    # one-owner masks are shared int objects (one per replica id): count each object once
    masks = {id(v): v for v in owners.values()}
    owner_bytes = sys.getsizeof(owners) + len(owners) * _INT_BYTES + sum(sys.getsizeof(v) for v in masks.values())
    entries = 0
    map_bytes = set_bytes = 0
    for rep in precise._replicas.values():
        entries += len(rep.eng2ours)
        map_bytes += sys.getsizeof(rep.eng2ours) + 2 * _INT_BYTES * len(rep.eng2ours) + sys.getsizeof(rep.extra)
        set_bytes += sys.getsizeof(rep.held)
    approx = index.approx
    return {
        "distinct_blocks": len(owners),
        "replica_block_entries": entries,
        "owner_map_bytes": owner_bytes,
        "engine_hash_map_bytes": map_bytes,
        "replica_set_bytes": set_bytes,
        "approx_blocks": len(approx.owners),
        "total_bytes": owner_bytes + map_bytes + set_bytes,
        "bytes_per_entry": round((owner_bytes + map_bytes + set_bytes) / max(entries, 1), 1),
    }


def _merge_index(runs: list[CellRun]) -> dict[str, Any]:
    keys = ("distinct_blocks", "replica_block_entries", "owner_map_bytes", "engine_hash_map_bytes",
            "replica_set_bytes", "approx_blocks", "total_bytes")
    merged: dict[str, Any] = {k: sum(int(r.kv_index[k]) for r in runs) for k in keys}
    merged["bytes_per_entry"] = round(merged["total_bytes"] / max(merged["replica_block_entries"], 1), 1)
    if len(runs) > 1:
        merged["largest_cell_bytes"] = max(int(r.kv_index["total_bytes"]) for r in runs)
    return merged


def summarize(runs: list[CellRun], run: ScaleRun, *, wall_s: float, cpu_s: float,
              cells_wall_s: float) -> dict[str, Any]:
    """The measurements of a run (one cell or several) as ``scale.json`` records them."""
    vt = max(r.virtual_s for r in runs)
    attempts = sum(r.attempts for r in runs)
    n_tasks = sum(r.tasks for r in runs)
    activities = sum(r.activities for r in runs)

    def per_s(x: float) -> float:
        return round(x / vt, 2) if vt > 0 else 0.0

    history = activities * EVENTS_PER_ACTIVITY + n_tasks * EVENTS_PER_WORKFLOW
    return {
        "replicas": run.replicas, "gpu": run.gpu, "policy": run.policy, "seed": run.seed, "tasks": run.tasks,
        "cells": len(runs), "replicas_per_cell": [r.replicas for r in runs],
        "arrival_rate_per_s": run.arrival_rate, "calls": sum(r.calls for r in runs), "attempts": attempts,
        "timing": _timing(runs, wall_s=wall_s, cpu_s=cpu_s, cells_wall_s=cells_wall_s),
        "decision": _decision(runs),
        "outcome": _outcome(runs),
        "kv_index": _merge_index(runs),
        "kv_events": _kv_events(runs, per_s, run.replicas),
        "store": {
            "attempt_rows": attempts, "task_rows": 2 * n_tasks,
            "attempt_rows_per_s": per_s(attempts), "task_rows_per_s": per_s(2 * n_tasks),
            "rows_per_s": per_s(attempts + 2 * n_tasks),
        },
        "temporal": {
            "workflows_per_s": per_s(n_tasks), "activities_per_s": per_s(activities),
            "history_events_per_s": per_s(history),
            "history_events_per_task_mean": round(history / max(n_tasks, 1), 1),
        },
        "peak_rss_mb": round(sum(r.peak_rss_mb for r in runs), 1),
        "machine": machine_info(),
    }


def _timing(runs: list[CellRun], *, wall_s: float, cpu_s: float, cells_wall_s: float) -> dict[str, Any]:
    """Wall and CPU time of the run and of its simulations, against the five-minute target."""
    vt = max(r.virtual_s for r in runs)
    sim_cpu = sum(r.simulate_cpu_s for r in runs)
    return {
        "wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1),
        "simulate_wall_s": round(cells_wall_s, 1), "simulate_cpu_s": round(sim_cpu, 1),
        "cell_simulate_wall_s": [round(r.simulate_wall_s, 1) for r in runs],
        "cpu_us_per_call": round(sim_cpu / max(sum(r.attempts for r in runs), 1) * 1e6, 1),
        "virtual_s": round(vt, 1), "virtual_per_wall": round(vt / max(cells_wall_s, 1e-9), 2),
        "target_wall_s": 300, "target_met": wall_s <= 300,
    }


def _decision(runs: list[CellRun]) -> dict[str, Any]:
    """Decision time per call, wall and the deciding thread's CPU, merged over the cells."""
    dec = np.concatenate([r.decision_ns for r in runs]).astype(np.float64) / 1000.0
    dcpu = np.concatenate([r.decision_cpu_ns for r in runs]).astype(np.float64) / 1000.0

    def pct(a: np.ndarray, q: float) -> float | None:
        return round(float(np.percentile(a, q)), 1) if a.size else None

    return {
        "count": int(dec.size),
        "wall_p50_us": pct(dec, 50), "wall_p99_us": pct(dec, 99),
        "cpu_p50_us": pct(dcpu, 50), "cpu_p99_us": pct(dcpu, 99),
        "cpu_mean_us": round(float(dcpu.mean()), 1) if dcpu.size else None,
        "cpu_total_s": round(float(dcpu.sum()) / 1e6, 1),
    }


def _outcome(runs: list[CellRun]) -> dict[str, Any]:
    """Tasks finished and within deadline, calls served and shed, the prefix-hit ratio."""
    n_tasks = sum(r.tasks for r in runs)
    met = sum(r.tasks_within_deadline for r in runs)
    prompt = sum(r.prompt_tokens for r in runs)
    cached = sum(r.cached_tokens for r in runs)
    return {
        "tasks_finished": sum(r.tasks_finished for r in runs), "tasks_within_deadline": met,
        "deadline_met_ratio": round(met / max(n_tasks, 1), 4),
        "calls_ok": sum(r.calls_ok for r in runs), "sheds": sum(r.sheds for r in runs),
        "prefix_hit_ratio": round(cached / prompt, 4) if prompt else None,
    }


def _kv_events(runs: list[CellRun], per_s: Callable[[float], float], replicas: int) -> dict[str, Any]:
    """KV-event fan-in into the schedulers: batches, events and blocks, per second too."""
    kv_batches = sum(r.kv_batches for r in runs)
    kv_events = sum(r.kv_events for r in runs)
    blocks = sum(r.blocks_stored + r.blocks_removed for r in runs)
    return {
        "batches": kv_batches, "events": kv_events,
        "blocks_stored": sum(r.blocks_stored for r in runs), "blocks_removed": sum(r.blocks_removed for r in runs),
        "batches_per_s": per_s(kv_batches), "events_per_s": per_s(kv_events), "blocks_per_s": per_s(blocks),
        "batches_per_s_per_replica": round(per_s(kv_batches) / replicas, 3),
        "block_size_tokens": runs[0].block_size,
    }


def markdown(r: dict[str, Any]) -> str:
    t, d, k, e, s, w = r["timing"], r["decision"], r["kv_index"], r["kv_events"], r["store"], r["temporal"]
    rows = [
        ("replicas / tasks / calls", f"{r['replicas']:,} / {r['tasks']:,} / {r['calls']:,}"),
        ("cells (one scheduler and process each)", f"{r['cells']} ({', '.join(map(str, r['replicas_per_cell']))} replicas)"),
        ("wall time (target 300 s)", f"{t['wall_s']:,} s ({'met' if t['target_met'] else 'not met'})"),
        ("CPU time", f"{t['cpu_s']:,} s (simulate {t['simulate_cpu_s']:,} s, {t['cpu_us_per_call']} µs per call)"),
        ("virtual time", f"{t['virtual_s']:,} s ({t['virtual_per_wall']}x wall)"),
        ("decision CPU p50 / p99", f"{d['cpu_p50_us']} / {d['cpu_p99_us']} µs (wall {d['wall_p50_us']} / {d['wall_p99_us']} µs)"),
        ("tasks within deadline", f"{r['outcome']['deadline_met_ratio']:.1%}, prefix hits {r['outcome']['prefix_hit_ratio']:.1%}"),
        ("KV index", f"{k['distinct_blocks']:,} blocks, {k['replica_block_entries']:,} (replica, block) entries, "
                     f"{k['total_bytes'] / 1e6:,.0f} MB ({k['bytes_per_entry']} B per entry)"),
        ("KV-event fan-in", f"{e['batches_per_s']:,} batches/s, {e['events_per_s']:,} events/s, "
                            f"{e['blocks_per_s']:,} blocks/s ({e['block_size_tokens']}-token blocks)"),
        ("cost rows", f"{s['rows_per_s']:,} rows/s ({s['attempt_rows_per_s']:,} attempts + {s['task_rows_per_s']:,} task writes)"),
        ("Temporal", f"{w['workflows_per_s']} workflows/s, {w['activities_per_s']:,} activities/s, "
                     f"~{w['history_events_per_s']:,} history events/s"),
        ("peak memory", f"{r['peak_rss_mb']:,} MB"),
    ]
    return "\n".join(["| measure | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])
