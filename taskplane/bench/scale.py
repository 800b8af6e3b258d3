"""Scale in simulation: one scheduler in front of 1,000 simulated replicas, 100,000 agent tasks.

    python -m taskplane.bench.scale [--replicas 1000] [--tasks 100000] [--rate 150]
                                    [--policy taskplane] [--seed 1] [--out DIR]

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
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from taskplane.bench.command import machine_info
from taskplane.bench.runner import TimedScheduler
from taskplane.bench.workloads import agent_tenants, agent_workload
from taskplane.scheduler.kvindex import KVIndex
from taskplane.scheduler.policies import build_policy
from taskplane.sim.cluster import ClusterSpec, simulate
from taskplane.store.records import Outcome, TaskStatus

#: Temporal history events per activity (ActivityTaskScheduled/Started/Completed plus the
#: workflow task that reacts: WorkflowTaskScheduled/Started/Completed) and per workflow
#: (WorkflowExecutionStarted/Completed plus its first workflow task)
EVENTS_PER_ACTIVITY = 6
EVENTS_PER_WORKFLOW = 5
_INT_BYTES = 36  # a CPython int holding a 64-bit hash (sys.getsizeof(2**63))


class CountingScheduler(TimedScheduler):
    """Times decisions (see :class:`TimedScheduler`) and counts the KV events fed in."""

    def __init__(self, policy: Any, progress: Any = None) -> None:
        super().__init__(policy, progress, every=2000)
        self.kv_batches = 0
        self.kv_events = 0
        self.blocks_stored = 0
        self.blocks_removed = 0

    def on_kv_events(self, replica: str, events: Any, seq: int | None = None) -> Any:
        self.kv_batches += 1
        for ev in events:
            self.kv_events += 1
            hashes = getattr(ev, "block_hashes", None)
            if hashes is None and isinstance(ev, dict):
                hashes = ev.get("block_hashes")
            n = len(hashes or ())
            if type(ev).__name__ == "BlockStored" or (isinstance(ev, dict) and ev.get("type") == "BlockStored"):
                self.blocks_stored += n
            else:
                self.blocks_removed += n
        return self.inner.on_kv_events(replica, events, seq)


def kv_index_size(index: KVIndex) -> dict[str, Any]:
    """Entries of the scheduler's KV index and an estimate of their memory.

    The precise index holds a dict block -> owner bitmask (an int of one bit per replica
    id) and, per replica, a dict engine hash -> our hash. Sizes are CPython's: the dicts'
    tables (``sys.getsizeof``) plus the int objects they reference."""
    precise = index.precise
    owners = precise.owners
    owner_bytes = sys.getsizeof(owners) + len(owners) * _INT_BYTES + sum(sys.getsizeof(v) for v in owners.values())
    entries = 0
    map_bytes = 0
    for rep in precise._replicas.values():
        entries += len(rep.eng2ours)
        map_bytes += sys.getsizeof(rep.eng2ours) + 2 * _INT_BYTES * len(rep.eng2ours) + sys.getsizeof(rep.extra)
    approx = index.approx
    return {
        "distinct_blocks": len(owners),
        "replica_block_entries": entries,
        "owner_map_bytes": owner_bytes,
        "engine_hash_map_bytes": map_bytes,
        "approx_blocks": len(approx.owners),
        "total_bytes": owner_bytes + map_bytes,
        "bytes_per_entry": round((owner_bytes + map_bytes) / max(entries, 1), 1),
    }


def run_scale(
    *,
    replicas: int = 1000,
    tasks: int = 100_000,
    rate: float | None = None,
    policy: str = "taskplane",
    gpu: str = "h100",
    seed: int = 1,
    console: Console | None = None,
) -> dict[str, Any]:
    """Simulate ``tasks`` agent tasks on ``replicas`` replicas; returns the measurements."""
    rate = rate if rate is not None else 0.15 * replicas
    t0, c0 = time.perf_counter(), time.process_time()
    workload = agent_workload(tasks, rate, seed)
    cluster = ClusterSpec.fleet(f"{gpu}:{replicas}")
    sched = build_policy(policy, seed=seed, tenants=agent_tenants(), metrics=False)
    t_gen, c_gen = time.perf_counter() - t0, time.process_time() - c0
    n_calls = workload.num_calls

    progress = None
    if console is not None:
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("calls"), TimeElapsedColumn(), console=console)
        bar = progress.add_task(f"{tasks:,} tasks on {replicas:,} replicas", total=n_calls)
        progress.start()

    def tick(done: int) -> None:
        if progress is not None:
            progress.update(bar, completed=min(done, n_calls))

    timed = CountingScheduler(sched, tick)
    gc.collect()
    gc.disable()
    t1, c1 = time.perf_counter(), time.process_time()
    try:
        result = simulate(cluster, workload, timed, seed=seed)
    finally:
        gc.enable()
        if progress is not None:
            progress.update(bar, completed=n_calls)
            progress.stop()
    t_sim, c_sim = time.perf_counter() - t1, time.process_time() - c1

    t2 = time.perf_counter()
    index = kv_index_size(sched.kv_index)
    calls = result.calls
    vt = result.end_s
    ok = sum(1 for c in calls if c.outcome is Outcome.SUCCESS)
    sheds = sum(1 for c in calls if c.outcome is Outcome.SHED)
    done = [t for t in result.tasks if t.status is not TaskStatus.RUNNING]
    met = sum(1 for t in result.tasks if t.deadline_met)
    prompt = sum(c.prompt_tokens for c in calls if c.outcome is Outcome.SUCCESS)
    cached = sum(c.cached_tokens for c in calls if c.outcome is Outcome.SUCCESS)
    dec = np.asarray(timed.decision_ns, dtype=np.float64) / 1000.0
    dcpu = np.asarray(timed.decision_cpu_ns, dtype=np.float64) / 1000.0
    tool_activities = sum(max(len(t.calls) - 1, 0) for t in workload.tasks)
    activities = len(calls) + tool_activities
    t_sum = time.perf_counter() - t2
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0

    def per_s(x: float) -> float:
        return round(x / vt, 2) if vt > 0 else 0.0

    return {
        "replicas": replicas, "gpu": gpu, "policy": policy, "seed": seed, "tasks": tasks,
        "arrival_rate_per_s": rate, "calls": len({(c.task_id, c.step) for c in calls}), "attempts": len(calls),
        "workload_calls": n_calls,
        "timing": {
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "generate_wall_s": round(t_gen, 1), "generate_cpu_s": round(c_gen, 1),
            "simulate_wall_s": round(t_sim, 1), "simulate_cpu_s": round(c_sim, 1),
            "summarize_wall_s": round(t_sum, 1),
            "cpu_us_per_call": round(c_sim / max(len(calls), 1) * 1e6, 1),
            "virtual_s": round(vt, 1), "virtual_per_wall": round(vt / max(t_sim, 1e-9), 2),
            "target_wall_s": 300, "target_met": wall <= 300,
        },
        "decision": {
            "count": int(dec.size),
            "wall_p50_us": round(float(np.percentile(dec, 50)), 1) if dec.size else None,
            "wall_p99_us": round(float(np.percentile(dec, 99)), 1) if dec.size else None,
            "cpu_p50_us": round(float(np.percentile(dcpu, 50)), 1) if dcpu.size else None,
            "cpu_p99_us": round(float(np.percentile(dcpu, 99)), 1) if dcpu.size else None,
            "cpu_mean_us": round(float(dcpu.mean()), 1) if dcpu.size else None,
            "cpu_total_s": round(float(dcpu.sum()) / 1e6, 1),
        },
        "outcome": {
            "tasks_finished": len(done), "tasks_within_deadline": met,
            "deadline_met_ratio": round(met / max(len(result.tasks), 1), 4),
            "calls_ok": ok, "sheds": sheds, "prefix_hit_ratio": round(cached / prompt, 4) if prompt else None,
        },
        "kv_index": index,
        "kv_events": {
            "batches": timed.kv_batches, "events": timed.kv_events,
            "blocks_stored": timed.blocks_stored, "blocks_removed": timed.blocks_removed,
            "batches_per_s": per_s(timed.kv_batches), "events_per_s": per_s(timed.kv_events),
            "blocks_per_s": per_s(timed.blocks_stored + timed.blocks_removed),
            "batches_per_s_per_replica": round(per_s(timed.kv_batches) / replicas, 3),
            "block_size_tokens": workload.block_size,
        },
        "store": {
            "attempt_rows": len(calls), "task_rows": 2 * len(result.tasks),
            "attempt_rows_per_s": per_s(len(calls)), "task_rows_per_s": per_s(2 * len(result.tasks)),
            "rows_per_s": per_s(len(calls) + 2 * len(result.tasks)),
        },
        "temporal": {
            "workflows_per_s": per_s(len(result.tasks)), "activities_per_s": per_s(activities),
            "history_events_per_s": per_s(activities * EVENTS_PER_ACTIVITY + len(result.tasks) * EVENTS_PER_WORKFLOW),
            "history_events_per_task_mean": round(
                (activities * EVENTS_PER_ACTIVITY + len(result.tasks) * EVENTS_PER_WORKFLOW) / max(len(result.tasks), 1), 1),
        },
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "machine": machine_info(),
    }


def markdown(r: dict[str, Any]) -> str:
    t, d, k, e, s, w = r["timing"], r["decision"], r["kv_index"], r["kv_events"], r["store"], r["temporal"]
    rows = [
        ("replicas / tasks / calls", f"{r['replicas']:,} / {r['tasks']:,} / {r['calls']:,}"),
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=None, help="task arrivals per second (default 0.15 x replicas)")
    ap.add_argument("--policy", default="taskplane")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    console = Console(stderr=True)
    r = run_scale(replicas=a.replicas, tasks=a.tasks, rate=a.rate, policy=a.policy, gpu=a.gpu, seed=a.seed,
                  console=console)
    md = markdown(r)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "scale.json").write_text(json.dumps(r, indent=2) + "\n")
        (a.out / "scale.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
