"""Scale in simulation: 1,000 simulated replicas, 100,000 agent tasks.

    taskplane bench --workload scale --replicas 1000 --tasks 100000 [--cells 2] --out DIR
    python -m taskplane.bench.scale [--replicas 1000] [--tasks 100000] [--rate 150]
                                    [--policy taskplane] [--seed 1] [--cells 1] [--out DIR]

One cell (the default) is one scheduler in front of the whole fleet. ``--cells N`` splits
fleet and tasks into N cells (tasks by a hash of their id), each with its own scheduler in
its own process — the cell design docs/scale.md proposes for large fleets, and the way
to use more than one core.

Runs the benchmark's agent mix (3-60 calls a task) in the virtual-time cluster simulator
with the same scheduler the gateway runs, fed by every replica's KV events, and measures
what the design needs at that size, so docs/scale.md can extrapolate to 10,000 GPUs:

- wall and CPU time of the whole run (the target is five minutes of wall time);
- decision time per call (wall and the deciding thread's CPU time);
- the KV index: distinct blocks, (replica, block) entries, an estimate of its memory;
- KV-event fan-in: event batches, events and blocks per second into the one scheduler;
- the write rate of cost rows (one per attempt, two per task: started, finished) and the
  Temporal load (workflows, activities and an estimate of history events per second);
- the process's peak memory.

Rates are per *virtual* second (what a live system of that size would see); times are
measured on this machine. Writes ``scale.json`` and ``scale.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import resource
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from taskplane.bench.command import machine_info
from taskplane.bench.runner import TimedScheduler
from taskplane.bench.workloads import agent_tenants, agent_workload
from taskplane.scheduler.kv.events import BlockRemoved, BlockStored
from taskplane.scheduler.kvindex import KVIndex
from taskplane.scheduler.policies import build_policy
from taskplane.sim.cluster import ClusterResult, ClusterSpec, simulate
from taskplane.sim.workloads.base import Workload
from taskplane.store.records import Outcome, TaskStatus

#: Temporal history events per activity (ActivityTaskScheduled/Started/Completed plus the
#: workflow task that reacts: WorkflowTaskScheduled/Started/Completed) and per workflow
#: (WorkflowExecutionStarted/Completed plus its first workflow task)
EVENTS_PER_ACTIVITY = 6
EVENTS_PER_WORKFLOW = 5
_INT_BYTES = 36  # a CPython int holding a 64-bit hash (sys.getsizeof(2**63))
_SUCCESS, _SHED = Outcome.SUCCESS, Outcome.SHED


class CountingScheduler(TimedScheduler):
    """Times decisions (see :class:`TimedScheduler`) and counts the KV events fed in."""

    def __init__(self, policy: Any, progress: Any = None) -> None:
        super().__init__(policy, progress, every=2000)
        self.kv_batches = 0
        self.kv_events = 0
        self.blocks_stored = 0
        self.blocks_removed = 0

    def on_kv_events(self, replica: str, events: Any, seq: int | None = None) -> Any:
        stored = removed = 0  # summed locally: this runs for every event batch of the run
        for ev in events:
            kind = type(ev)
            if kind is BlockStored:
                stored += len(ev.block_hashes)
            elif kind is BlockRemoved:
                removed += len(ev.block_hashes)
            elif isinstance(ev, dict):  # raw msgpack maps
                n = len(ev.get("block_hashes") or ())
                if ev.get("type") == "BlockStored":
                    stored += n
                else:
                    removed += n
        self.kv_batches += 1
        self.kv_events += len(events)
        self.blocks_stored += stored
        self.blocks_removed += removed
        return self.inner.on_kv_events(replica, events, seq)


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


def cell_of(task_id: str, cells: int) -> int:
    """The cell a task runs in: a stable hash of its id (the global layer routes tasks,
    not calls; every call of a task stays in its cell, with its KV cache)."""
    return zlib.crc32(task_id.encode()) % cells if cells > 1 else 0


def _cell_fleet(gpu: str, replicas: int, cell: int, cells: int) -> ClusterSpec:
    """Replicas ``cell``, ``cell + cells``, ... of a ``replicas``-wide fleet."""
    fleet = ClusterSpec.fleet(f"{gpu}:{replicas}")
    return ClusterSpec(fleet.replicas[cell::cells])


def simulate_cell(
    *, replicas: int, tasks: int, rate: float, policy: str, gpu: str, seed: int, cell: int = 0, cells: int = 1,
    tick: Callable[[int], None] | None = None, workload: Workload | None = None,
) -> CellRun:
    """Simulate one cell: its share of the fleet and of the tasks, with its own scheduler.

    ``workload``: the whole run's tasks when already generated (default: generate them)."""
    gc.collect()
    gc.disable()  # until the measures are taken: a collection then would walk every record
    try:
        return _simulate_cell(replicas=replicas, tasks=tasks, rate=rate, policy=policy, gpu=gpu, seed=seed,
                              cell=cell, cells=cells, tick=tick, workload=workload)[0]
    finally:
        gc.enable()


def _simulate_cell(
    *, replicas: int, tasks: int, rate: float, policy: str, gpu: str, seed: int, cell: int, cells: int,
    tick: Callable[[int], None] | None, workload: Workload | None,
) -> tuple[CellRun, tuple[Any, ...]]:
    """:func:`simulate_cell` (with the collector already paused), and the simulation's
    objects: a caller about to exit keeps them alive rather than free them one by one."""
    workload = workload if workload is not None else agent_workload(tasks, rate, seed)
    if cells > 1:
        workload = Workload(workload.name, [t for t in workload.tasks if cell_of(t.task_id, cells) == cell],
                            workload.block_size, dict(workload.meta))
    cluster = _cell_fleet(gpu, replicas, cell, cells)
    sched = build_policy(policy, seed=seed, tenants=agent_tenants(), metrics=False)
    timed = CountingScheduler(sched, tick)
    t1, c1 = time.perf_counter(), time.process_time()
    result = simulate(cluster, workload, timed, seed=seed)
    t_sim, c_sim = time.perf_counter() - t1, time.process_time() - c1
    return _measure(result, workload, timed, sched.kv_index, t_sim, c_sim), (result, workload, timed)


def _measure(result: ClusterResult, workload: Workload, timed: CountingScheduler, index: KVIndex,
             wall_s: float, cpu_s: float) -> CellRun:
    """A cell's measures from its simulation's result (one pass over the attempts)."""
    # a call's attempt n+1 exists only once attempt n is recorded: the distinct calls are
    # the first attempts (no set of 875,000 (task, step) keys per cell)
    first = ok = sheds = prompt = cached = 0
    for c in result.calls:
        if c.attempt == 1:
            first += 1
        if c.outcome is _SUCCESS:
            ok += 1
            prompt += c.prompt_tokens
            cached += c.cached_tokens
        elif c.outcome is _SHED:
            sheds += 1
    attempts = len(result.calls)
    return CellRun(
        replicas=len(result.replicas), tasks=len(workload.tasks), attempts=attempts, calls=first, calls_ok=ok,
        sheds=sheds, tasks_finished=sum(1 for t in result.tasks if t.status is not TaskStatus.RUNNING),
        tasks_within_deadline=sum(1 for t in result.tasks if t.deadline_met),
        prompt_tokens=prompt, cached_tokens=cached, virtual_s=result.end_s,
        activities=attempts + sum(max(len(t.calls) - 1, 0) for t in workload.tasks),
        kv_batches=timed.kv_batches, kv_events=timed.kv_events,
        blocks_stored=timed.blocks_stored, blocks_removed=timed.blocks_removed,
        kv_index=kv_index_size(index),
        decision_ns=np.asarray(timed.decision_ns, dtype=np.int64),
        decision_cpu_ns=np.asarray(timed.decision_cpu_ns, dtype=np.int64),
        simulate_wall_s=wall_s, simulate_cpu_s=cpu_s,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        block_size=workload.block_size,
    )


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cell_child(kwargs: dict[str, Any], done: Any, conn: Any) -> None:
    def tick(n: int) -> None:
        done.value = n

    gc.collect()
    gc.disable()  # for good: the process ends right after reporting
    try:
        run, _keep_alive = _simulate_cell(**kwargs, tick=tick)
        conn.send(("ok", run))
    except BaseException as e:  # report it to the parent instead of dying silently
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()
    # exit now, with the simulation's millions of objects still alive: freeing them one by
    # one (seconds) would delay the parent's join, on the run's serial path
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _run_cells(kwargs: dict[str, Any], cells: int, tick: Callable[[int], None]) -> list[CellRun]:
    """One child process per cell (fork: the children share the parent's imports)."""
    ctx = mp.get_context("fork")
    counters = [ctx.Value("q", 0, lock=False) for _ in range(cells)]
    pipes = [ctx.Pipe(duplex=False) for _ in range(cells)]
    procs = [ctx.Process(target=_cell_child, args=({**kwargs, "cell": c, "cells": cells}, counters[c], pipes[c][1]),
                         name=f"scale-cell-{c}", daemon=True) for c in range(cells)]
    for proc in procs:
        proc.start()
    results: dict[int, CellRun] = {}
    try:
        while len(results) < cells:
            # sleep until a cell reports (or half a second for the progress bar): the parent
            # shares a core with a cell, so it must not spin
            ready = mp_connection.wait([recv for c, (recv, _) in enumerate(pipes) if c not in results], timeout=0.5)
            for c, (recv, _) in enumerate(pipes):
                if c in results:
                    continue
                if recv not in ready:
                    if not procs[c].is_alive() and not recv.poll():
                        raise RuntimeError(f"cell {c} exited with code {procs[c].exitcode} before reporting")
                    continue
                status, value = recv.recv()
                if status != "ok":
                    raise RuntimeError(f"cell {c} failed: {value}")
                results[c] = value
            tick(sum(int(v.value) for v in counters))
    finally:
        for proc in procs:
            if proc.is_alive() and len(results) < cells:
                proc.terminate()
            proc.join()
    return [results[c] for c in range(cells)]


def _generate(tasks: int, rate: float, seed: int) -> Workload:
    """The run's tasks, generated with the garbage collector paused.

    Generation allocates ~20 objects per task and no cycles: the collector would walk the
    growing heap over and over (~30 % of generation time, on the serial path before the
    cells start)."""
    gc.disable()
    try:
        return agent_workload(tasks, rate, seed)
    finally:
        gc.enable()


def run_scale(
    *,
    replicas: int = 1000,
    tasks: int = 100_000,
    rate: float | None = None,
    policy: str = "taskplane",
    gpu: str = "h100",
    seed: int = 1,
    cells: int = 1,
    console: Console | None = None,
) -> dict[str, Any]:
    """Simulate ``tasks`` agent tasks on ``replicas`` replicas; returns the measurements.

    ``cells`` > 1 splits the fleet and the tasks into that many cells, each with its own
    scheduler (gateway) in its own process, as docs/scale.md proposes for large fleets;
    the figures are then summed (rates, rows, index entries) or merged (decision times)."""
    if cells < 1 or cells > replicas:
        raise ValueError(f"cells must be between 1 and the number of replicas ({replicas}), got {cells}")
    rate = rate if rate is not None else 0.15 * replicas
    t0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu_s()
    workload = _generate(tasks, rate, seed)  # once: forked cells inherit it
    n_calls = workload.num_calls

    progress = None
    if console is not None:
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("calls"), TimeElapsedColumn(), console=console,
                            refresh_per_second=2)  # its thread shares a core with a cell
        label = f"{tasks:,} tasks on {replicas:,} replicas" + (f" in {cells} cells" if cells > 1 else "")
        bar = progress.add_task(label, total=n_calls)
        progress.start()

    def tick(done: int) -> None:
        if progress is not None:
            progress.update(bar, completed=min(done, n_calls))

    kwargs = dict(replicas=replicas, tasks=tasks, rate=rate, policy=policy, gpu=gpu, seed=seed, workload=workload)
    # frozen, the tasks are skipped by every later collection, including each forked cell's
    # (which would otherwise walk them all and dirty their copy-on-write pages)
    gc.freeze()
    t1 = time.perf_counter()
    try:
        runs = [simulate_cell(**kwargs, tick=tick)] if cells == 1 else _run_cells(kwargs, cells, tick)  # type: ignore[arg-type]
    finally:
        if progress is not None:
            progress.update(bar, completed=n_calls)
            progress.stop()
        gc.unfreeze()
    t_cells = time.perf_counter() - t1
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0 + _children_cpu_s() - k0  # the cells' processes included
    return summarize(runs, replicas=replicas, tasks=tasks, rate=rate, policy=policy, gpu=gpu, seed=seed,
                     wall_s=wall, cpu_s=cpu, cells_wall_s=t_cells)


def _merge_index(runs: list[CellRun]) -> dict[str, Any]:
    keys = ("distinct_blocks", "replica_block_entries", "owner_map_bytes", "engine_hash_map_bytes",
            "replica_set_bytes", "approx_blocks", "total_bytes")
    merged: dict[str, Any] = {k: sum(int(r.kv_index[k]) for r in runs) for k in keys}
    merged["bytes_per_entry"] = round(merged["total_bytes"] / max(merged["replica_block_entries"], 1), 1)
    if len(runs) > 1:
        merged["largest_cell_bytes"] = max(int(r.kv_index["total_bytes"]) for r in runs)
    return merged


def summarize(
    runs: list[CellRun], *, replicas: int, tasks: int, rate: float, policy: str, gpu: str, seed: int,
    wall_s: float, cpu_s: float, cells_wall_s: float,
) -> dict[str, Any]:
    """The measurements of a run (one cell or several) as ``scale.json`` records them."""
    vt = max(r.virtual_s for r in runs)
    attempts = sum(r.attempts for r in runs)
    n_tasks = sum(r.tasks for r in runs)
    met = sum(r.tasks_within_deadline for r in runs)
    prompt = sum(r.prompt_tokens for r in runs)
    cached = sum(r.cached_tokens for r in runs)
    dec = np.concatenate([r.decision_ns for r in runs]).astype(np.float64) / 1000.0
    dcpu = np.concatenate([r.decision_cpu_ns for r in runs]).astype(np.float64) / 1000.0
    activities = sum(r.activities for r in runs)
    kv_batches = sum(r.kv_batches for r in runs)
    kv_events = sum(r.kv_events for r in runs)
    blocks = sum(r.blocks_stored + r.blocks_removed for r in runs)
    sim_cpu = sum(r.simulate_cpu_s for r in runs)

    def per_s(x: float) -> float:
        return round(x / vt, 2) if vt > 0 else 0.0

    def pct(a: np.ndarray, q: float) -> float | None:
        return round(float(np.percentile(a, q)), 1) if a.size else None

    history = activities * EVENTS_PER_ACTIVITY + n_tasks * EVENTS_PER_WORKFLOW
    return {
        "replicas": replicas, "gpu": gpu, "policy": policy, "seed": seed, "tasks": tasks,
        "cells": len(runs), "replicas_per_cell": [r.replicas for r in runs],
        "arrival_rate_per_s": rate, "calls": sum(r.calls for r in runs), "attempts": attempts,
        "timing": {
            "wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1),
            "simulate_wall_s": round(cells_wall_s, 1), "simulate_cpu_s": round(sim_cpu, 1),
            "cell_simulate_wall_s": [round(r.simulate_wall_s, 1) for r in runs],
            "cpu_us_per_call": round(sim_cpu / max(attempts, 1) * 1e6, 1),
            "virtual_s": round(vt, 1), "virtual_per_wall": round(vt / max(cells_wall_s, 1e-9), 2),
            "target_wall_s": 300, "target_met": wall_s <= 300,
        },
        "decision": {
            "count": int(dec.size),
            "wall_p50_us": pct(dec, 50), "wall_p99_us": pct(dec, 99),
            "cpu_p50_us": pct(dcpu, 50), "cpu_p99_us": pct(dcpu, 99),
            "cpu_mean_us": round(float(dcpu.mean()), 1) if dcpu.size else None,
            "cpu_total_s": round(float(dcpu.sum()) / 1e6, 1),
        },
        "outcome": {
            "tasks_finished": sum(r.tasks_finished for r in runs), "tasks_within_deadline": met,
            "deadline_met_ratio": round(met / max(n_tasks, 1), 4),
            "calls_ok": sum(r.calls_ok for r in runs), "sheds": sum(r.sheds for r in runs),
            "prefix_hit_ratio": round(cached / prompt, 4) if prompt else None,
        },
        "kv_index": _merge_index(runs),
        "kv_events": {
            "batches": kv_batches, "events": kv_events,
            "blocks_stored": sum(r.blocks_stored for r in runs), "blocks_removed": sum(r.blocks_removed for r in runs),
            "batches_per_s": per_s(kv_batches), "events_per_s": per_s(kv_events), "blocks_per_s": per_s(blocks),
            "batches_per_s_per_replica": round(per_s(kv_batches) / replicas, 3),
            "block_size_tokens": runs[0].block_size,
        },
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


def run_scale_command(
    *, out: Path | None, replicas: int = 1000, tasks: int = 100_000, rate: float | None = None,
    policy: str = "taskplane", gpu: str = "h100", seed: int = 1, cells: int = 1,
) -> dict[str, Any]:
    """Run, print the table, and write ``scale.json`` and ``scale.md`` to ``out``."""
    console = Console(stderr=True)
    r = run_scale(replicas=replicas, tasks=tasks, rate=rate, policy=policy, gpu=gpu, seed=seed, cells=cells,
                  console=console)
    md = markdown(r)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "scale.json").write_text(json.dumps(r, indent=2) + "\n")
        (out / "scale.md").write_text(md + "\n")
    print(md)
    return r


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=None, help="task arrivals per second (default 0.15 x replicas)")
    ap.add_argument("--policy", default="taskplane")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cells", type=int, default=1, help="cells, each with its own scheduler and process")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    run_scale_command(out=a.out, replicas=a.replicas, tasks=a.tasks, rate=a.rate, policy=a.policy, gpu=a.gpu,
                      seed=a.seed, cells=a.cells)


if __name__ == "__main__":
    main()
