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
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from taskplane.bench.runner import TimedScheduler
from taskplane.bench.scale_report import CellRun, ScaleRun, kv_index_size, markdown, summarize
from taskplane.bench.workloads import agent_tenants, agent_workload
from taskplane.scheduler.kv.events import BlockRemoved, BlockStored
from taskplane.scheduler.kvindex import KVIndex
from taskplane.scheduler.policies import build_policy
from taskplane.sim.cluster import ClusterResult, ClusterSpec, simulate
from taskplane.sim.workloads.base import Workload
from taskplane.store.records import Outcome, TaskStatus


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


def cell_of(task_id: str, cells: int) -> int:
    """The cell a task runs in: a stable hash of its id (the global layer routes tasks,
    not calls; every call of a task stays in its cell, with its KV cache)."""
    return zlib.crc32(task_id.encode()) % cells if cells > 1 else 0


def _cell_fleet(gpu: str, replicas: int, cell: int, cells: int) -> ClusterSpec:
    """Replicas ``cell``, ``cell + cells``, ... of a ``replicas``-wide fleet."""
    fleet = ClusterSpec.fleet(f"{gpu}:{replicas}")
    return ClusterSpec(fleet.replicas[cell::cells])


def simulate_cell(run: ScaleRun, *, cell: int = 0, tick: Callable[[int], None] | None = None,
                  workload: Workload | None = None) -> CellRun:
    """Simulate cell ``cell`` of ``run``: its share of the fleet and of the tasks, with its own scheduler.

    ``workload``: the whole run's tasks when already generated (default: generate them)."""
    gc.collect()
    gc.disable()  # until the measures are taken: a collection then would walk every record
    try:
        return _simulate_cell(run, cell=cell, tick=tick, workload=workload)[0]
    finally:
        gc.enable()


def _simulate_cell(run: ScaleRun, *, cell: int, tick: Callable[[int], None] | None,
                   workload: Workload | None) -> tuple[CellRun, tuple[Any, ...]]:
    """:func:`simulate_cell` (with the collector already paused), and the simulation's
    objects: a caller about to exit keeps them alive rather than free them one by one."""
    cells = run.cells
    workload = workload if workload is not None else agent_workload(run.tasks, run.arrival_rate, run.seed)
    if cells > 1:
        workload = Workload(workload.name, [t for t in workload.tasks if cell_of(t.task_id, cells) == cell],
                            workload.block_size, dict(workload.meta))
    cluster = _cell_fleet(run.gpu, run.replicas, cell, cells)
    sched = build_policy(run.policy, seed=run.seed, tenants=agent_tenants(), metrics=False)
    timed = CountingScheduler(sched, tick)
    t1, c1 = time.perf_counter(), time.process_time()
    result = simulate(cluster, workload, timed, seed=run.seed)
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
        if c.outcome is Outcome.SUCCESS:
            ok += 1
            prompt += c.prompt_tokens
            cached += c.cached_tokens
        elif c.outcome is Outcome.SHED:
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


def _cell_child(run: ScaleRun, cell: int, workload: Workload, done: Any, conn: Any) -> None:
    def tick(n: int) -> None:
        done.value = n

    gc.collect()
    gc.disable()  # for good: the process ends right after reporting
    try:
        measured, _keep_alive = _simulate_cell(run, cell=cell, tick=tick, workload=workload)
        conn.send(("ok", measured))
    except BaseException as e:  # report it to the parent instead of dying silently
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()
    # exit now, with the simulation's millions of objects still alive: freeing them one by
    # one (seconds) would delay the parent's join, on the run's serial path
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _run_cells(run: ScaleRun, workload: Workload, tick: Callable[[int], None]) -> list[CellRun]:
    """One child process per cell (fork: the children share the parent's imports)."""
    cells = run.cells
    ctx = mp.get_context("fork")
    counters = [ctx.Value("q", 0, lock=False) for _ in range(cells)]
    pipes = [ctx.Pipe(duplex=False) for _ in range(cells)]
    procs = [ctx.Process(target=_cell_child, args=(run, c, workload, counters[c], pipes[c][1]),
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


def run_scale(run: ScaleRun, *, console: Console | None = None) -> dict[str, Any]:
    """Simulate ``run.tasks`` agent tasks on ``run.replicas`` replicas; returns the measurements.

    ``run.cells`` > 1 splits the fleet and the tasks into that many cells, each with its own
    scheduler (gateway) in its own process, as docs/scale.md proposes for large fleets;
    the figures are then summed (rates, rows, index entries) or merged (decision times)."""
    if run.cells < 1 or run.cells > run.replicas:
        raise ValueError(f"cells must be between 1 and the number of replicas ({run.replicas}), got {run.cells}")
    t0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu_s()
    workload = _generate(run.tasks, run.arrival_rate, run.seed)  # once: forked cells inherit it
    n_calls = workload.num_calls

    progress = None
    if console is not None:
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("calls"), TimeElapsedColumn(), console=console,
                            refresh_per_second=2)  # its thread shares a core with a cell
        label = f"{run.tasks:,} tasks on {run.replicas:,} replicas" + (f" in {run.cells} cells" if run.cells > 1 else "")
        bar = progress.add_task(label, total=n_calls)
        progress.start()

    def tick(done: int) -> None:
        if progress is not None:
            progress.update(bar, completed=min(done, n_calls))

    # frozen, the tasks are skipped by every later collection, including each forked cell's
    # (which would otherwise walk them all and dirty their copy-on-write pages)
    gc.freeze()
    t1 = time.perf_counter()
    try:
        runs = ([simulate_cell(run, tick=tick, workload=workload)] if run.cells == 1
                else _run_cells(run, workload, tick))
    finally:
        if progress is not None:
            progress.update(bar, completed=n_calls)
            progress.stop()
        gc.unfreeze()
    t_cells = time.perf_counter() - t1
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0 + _children_cpu_s() - k0  # the cells' processes included
    return summarize(runs, run, wall_s=wall, cpu_s=cpu, cells_wall_s=t_cells)


def run_scale_command(run: ScaleRun, *, out: Path | None) -> dict[str, Any]:
    """Run, print the table, and write ``scale.json`` and ``scale.md`` to ``out``."""
    console = Console(stderr=True)
    r = run_scale(run, console=console)
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
    run_scale_command(ScaleRun(replicas=a.replicas, tasks=a.tasks, rate=a.rate, policy=a.policy, gpu=a.gpu,
                               seed=a.seed, cells=a.cells), out=a.out)


if __name__ == "__main__":
    main()
