"""Agent sessions on the live stack: many concurrent multi-step agent tasks on simulated
replicas, through taskplane's gateway (Envoy + the endpoint picker) and straight to the
replicas with a client-side round-robin, in one run.

    python -m taskplane.bench.agent_sessions --sessions 72 --replicas 3 --rounds 3 --out agents-live.json

Why this bench: the live agent target ("72 sessions at once on 3 replicas: mean call
latency <= 0.8x round-robin straight to the replicas, every task within its budget") is a
claim about real processes on real sockets, which the virtual-time simulator cannot check.

The workload is the real-vLLM bench's agents (:mod:`taskplane.bench.real_workload`): each
task's calls append to its context (system prompt of its agent type, goal, tool results,
replies), a tool gap separates its calls, and each task has a deadline budget. The client
(:mod:`taskplane.bench.real_client`) drives every task closed loop. Targets:

- ``round-robin``: straight to the replicas, calls taken in turn (no router);
- ``taskplane``: through the gateway with taskplane's headers (task, session, step, steps
  left, tenant, priority, budget);
- ``plain``: through the gateway with no headers at all (the contract has no plain
  session header: the gateway sees only the prompt, and its KV index).

Every target gets byte-identical prompts (task ids are renamed per run so that no session
state carries over) on the same replicas, whose prefix caches are reset before each run.
Rounds rotate the targets' order so that none always runs first on a warmer machine.
The replicas model an H100 at ``--speed 1`` by default: the prefill of uncached tokens
costs what it would on the GPU (~30k tokens/s), so KV-warm placement can show.

Figures per run: call latency (client e2e, first send to the last byte, 429 waits
included) and TTFT mean / p50 / p99, tasks within budget, refusals (429 answers), calls per
replica and prefix hits from the replicas' own ``/metrics``, the gateway's admission wait
(``X-Taskplane-Queue-Ms``); per round, each target's ratio to round-robin of that round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import psutil
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from taskplane.bench.live_stack import (
    cpu_by_process,
    cpu_seconds,
    embedded_postgres,
    pin_gateway_apart,
    reset_caches,
    start_cluster,
    wait_gateway_live,
)
from taskplane.bench.real_client import HeaderStyle, Target, TaskRun, drive
from taskplane.bench.real_metrics import histograms, parse_counters
from taskplane.bench.real_workload import CPU_TENANTS, RealWorkload, real_agent_workload
from taskplane.dev.local import LocalCluster, LocalReplica

MODEL = "llama-3.1-8b"
#: the replicas' own latency histograms: the time a call spent at its replica, without the
#: data plane in front and the client's own CPU (what placement changes, alone)
REPLICA_HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds")
TARGETS: dict[str, HeaderStyle | None] = {"round-robin": None, "taskplane": "taskplane", "plain": "plain"}
#: ``--arrival phases``: (duration_s, rate multiplier) pairs, a light stretch then a heavy
#: one (the pattern repeats until every session has arrived)
LIGHT_HEAVY: tuple[tuple[float, float], ...] = ((20.0, 0.3), (20.0, 1.6))


def workload(sessions: int, seed: int, arrival: str, burst_s: float, rate_per_s: float,
             max_context: int = 4000) -> RealWorkload:
    """The agent tasks: ``burst`` (every session starts within ``burst_s``: "N at once") or
    ``phases`` (a light stretch at 0.3x ``rate_per_s``, then a heavy one at 1.6x)."""
    if arrival == "burst":
        return real_agent_workload(sessions, seed, rate_per_s=sessions / burst_s, phases=(),
                                   max_context_tokens=max_context)
    if arrival == "phases":
        return real_agent_workload(sessions, seed, rate_per_s=rate_per_s, phases=LIGHT_HEAVY,
                                   max_context_tokens=max_context)
    raise ValueError(f"unknown arrival shape {arrival!r} (burst or phases)")


def renamed(wl: RealWorkload, label: str) -> RealWorkload:
    """The same tasks under new ids: a gateway keeps session pins by task id, and a run
    must not inherit the last run's."""
    tasks = [dataclasses.replace(t, task_id=f"{label}-{t.task_id}") for t in wl.tasks]
    return dataclasses.replace(wl, tasks=tasks)


def gateway_config(sessions: int, admission: bool = True) -> dict[str, Any]:
    """The workload's tenants (and ``default`` for plain clients), none capped below the run."""
    cap = 4 * sessions + 16
    tenants = [{"id": t.name, "max_priority": t.priority, "max_concurrent": cap} for t in CPU_TENANTS]
    tenants.append({"id": "default", "max_priority": "interactive", "max_concurrent": cap})
    return {"tenants": tenants, "limits": {"request_timeout_s": 300.0}, "scheduler": {"admission": admission}}


def _counters(client: httpx.Client, replicas: Sequence[LocalReplica]) -> list[dict[str, float]]:
    out = []
    for r in replicas:
        resp = client.get(f"{r.url}/metrics")
        resp.raise_for_status()
        values = parse_counters(resp.text, r.model)
        for key, h in histograms(resp.text, REPLICA_HISTOGRAMS).items():
            values[f"{key}_sum"], values[f"{key}_count"] = h.sum, h.count
        out.append(values)
    return out


def _ms(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"mean": None, "p50": None, "p99": None}
    s = sorted(xs)

    def q(p: float) -> float:
        return round(s[min(len(s) - 1, round(p * (len(s) - 1)))] * 1000.0, 1)

    return {"mean": round(statistics.fmean(s) * 1000.0, 1), "p50": q(0.50), "p99": q(0.99)}


def run_figures(tasks: Sequence[TaskRun], before: list[dict[str, float]], after: list[dict[str, float]],
                wall_s: float) -> dict[str, Any]:
    """One target's run: latency, budgets, refusals, spread and prefix hits (JSON-able)."""
    deltas = [{k: a[k] - b.get(k, 0.0) for k in a} for a, b in zip(after, before, strict=True)]
    calls = [c for t in tasks for c in t.calls]
    ok = [c for c in calls if c.ok]
    queue = [c.queue_ms for c in ok if c.queue_ms is not None]
    # the opening: until the last task sent its first call (every session arriving at once)
    opening_end = max((t.calls[0].sent_s for t in tasks if t.calls), default=0.0)
    opening = [c.e2e_s for c in ok if c.e2e_s is not None and c.sent_s <= opening_end]
    later = [c.e2e_s for c in ok if c.e2e_s is not None and c.sent_s > opening_end]
    hits, queries = sum(d["hits"] for d in deltas), sum(d["queries"] for d in deltas)
    return {
        "tasks": len(tasks),
        "tasks_completed": sum(1 for t in tasks if t.completed),
        "tasks_within_budget": sum(1 for t in tasks if t.result.deadline_met),
        "calls": len(calls), "calls_ok": len(ok),
        "call_errors": sorted({c.error or "" for c in calls if not c.ok})[:5],
        "refusals": sum(c.sheds for c in calls),
        "calls_refused": sum(1 for c in calls if c.sheds),
        "call_ms": _ms([c.e2e_s for c in ok if c.e2e_s is not None]),
        "ttft_ms": _ms([c.ttft_s for c in ok if c.ttft_s is not None]),
        "opening_s": round(opening_end, 2),
        "call_ms_opening": {"calls": len(opening), "mean": _ms(opening)["mean"]},
        "call_ms_after_opening": {"calls": len(later), "mean": _ms(later)["mean"]},
        "queue_ms": {"mean": round(statistics.fmean(queue), 1), "max": round(max(queue), 1)} if queue else None,
        "replica_side_ms": {
            kind: round(1000.0 * sum(d[f"{name}_sum"] for d in deltas) / n, 1) if (n := sum(d[f"{name}_count"] for d in deltas)) else None
            for kind, name in zip(("ttft_mean", "e2e_mean"), REPLICA_HISTOGRAMS, strict=True)},
        "calls_per_replica": [int(d["requests"]) for d in deltas],
        "prefix_hit_ratio": round(hits / queries, 4) if queries else None,
        "prompt_tokens": int(queries), "prompt_tokens_computed": int(queries - hits),
        "wall_s": round(wall_s, 1),
    }


def one_run(cluster: LocalCluster, target: str, wl: RealWorkload, label: str,
            progress: Callable[[int], None] | None = None) -> tuple[dict[str, Any], list[TaskRun]]:
    """Reset the caches, drive ``wl`` (renamed ``label``) at ``target``, read the replicas."""
    style = TARGETS[target]
    if style is None:
        tgt = Target(target, [r.url for r in cluster.replicas], "plain", model=MODEL)
    else:
        tgt = Target(target, [cluster.gateway_url], style, model=MODEL)
    with httpx.Client(timeout=30.0, trust_env=False) as client:
        reset_caches(client, cluster.replicas)
        time.sleep(0.5)  # the gateway's KV index takes the AllBlocksCleared events
        before = _counters(client, cluster.replicas)
        load0 = os.getloadavg()[0]
        cpu0 = process_cpu(cluster)
        tasks, wall = asyncio.run(drive(tgt, renamed(wl, label), progress=progress))
        cpu1 = process_cpu(cluster)
        after = _counters(client, cluster.replicas)
    figures = run_figures(tasks, before, after, wall)
    n = max(1, figures["calls"])
    figures["cpu_ms_per_call"] = {k: round((cpu1[k] - cpu0[k]) * 1000.0 / n, 2) for k in cpu1}
    figures["load_average_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    return figures, tasks


def process_cpu(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds so far of the picker, Envoy, the replicas, and this client:
    on a shared 2-core machine they compete, and a target's latency includes that."""
    assert cluster.gateway_pid is not None
    replicas = sum(cpu_seconds(psutil.Process(r.pid)) for r in cluster.replicas if r.pid is not None)
    t = os.times()
    gateway = cpu_by_process(psutil.Process(cluster.gateway_pid))  # the picker's process, and Envoy
    return {"picker": gateway.get("gateway", 0.0), "envoy": sum(v for k, v in gateway.items() if k != "gateway"),
            "replicas": replicas, "client": t.user + t.system}


def ratios(run: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each target's call latency and TTFT over round-robin's of the same round, at the
    client (what an agent waits) and at the replicas (what placement changed, alone)."""
    base = run.get("round-robin")
    out: dict[str, dict[str, float | None]] = {}
    if base is None:
        return out
    for name, fig in run.items():
        if name == "round-robin":
            continue
        out[name] = {}
        pairs = [(f"{kind[:-3]}_{p}", fig[kind][p], base[kind][p]) for kind in ("call_ms", "ttft_ms")
                 for p in ("mean", "p50", "p99")]
        pairs += [(f"replica_{k}", fig["replica_side_ms"][k], base["replica_side_ms"][k]) for k in ("e2e_mean", "ttft_mean")]
        out[name] = {key: round(a / b, 3) if a is not None and b else None for key, a, b in pairs}
    return out


@dataclass(frozen=True, kw_only=True)
class SessionsOptions:
    """One run of the bench (the command's flags; defaults as its)."""

    sessions: int = 72  # agent tasks per run
    replicas: int = 3
    rounds: int = 3  # runs per target, the targets' order rotated each round
    targets: tuple[str, ...] = tuple(TARGETS)
    seed: int = 1
    arrival: str = "burst"  # burst: every session within burst_s; phases: light then heavy (LIGHT_HEAVY)
    burst_s: float = 1.0
    rate_per_s: float = 3.0  # tasks per second before the phase multiplier (phases)
    speed: float = 1.0  # the replicas' speed-up over their H100 timing model (1: GPU time)
    kv_blocks: int = 4096  # KV blocks of 16 tokens per replica
    max_context: int = 4000  # a task ends before its context would pass this many tokens
    admission: bool = True
    pin: bool = False  # the gateway on a core of its own (``pin_gateway_apart``)
    postgres: bool = False  # an embedded Postgres for the gateway's attempt rows


def bench(options: SessionsOptions, *, workdir: Path | None = None, calls_out: Path | None = None,
          console: Console | None = None) -> dict[str, Any]:
    """Start the replicas and the gateway once, run every target ``options.rounds`` times
    (order rotated each round), stop everything; return the figures."""
    o = options
    unknown = [t for t in o.targets if t not in TARGETS]
    if unknown:
        raise ValueError(f"unknown targets {unknown} (choose from {', '.join(TARGETS)})")
    console = console or Console(stderr=True)
    wl = workload(o.sessions, o.seed, o.arrival, o.burst_s, o.rate_per_s, o.max_context)
    pinned: dict[str, list[int]] | None = None
    with tempfile.TemporaryDirectory(prefix="tp-agents-live-") as tmp:
        wd = workdir or Path(tmp)
        with contextlib.ExitStack() as stack:
            database_url = stack.enter_context(embedded_postgres(wd)) if o.postgres else None
            cluster = start_cluster(LocalCluster(wd, replicas=o.replicas, speed=o.speed, kv_blocks=o.kv_blocks,
                                                 model=MODEL, config_overrides=gateway_config(o.sessions, o.admission),
                                                 database_url=database_url))
            stack.callback(cluster.stop)
            sink = stack.enter_context(calls_out.open("w")) if calls_out else None
            with httpx.Client(timeout=30.0, trust_env=False) as client:
                wait_gateway_live(client, cluster.gateway_url, cluster.replicas)
            pinned = pin_gateway_apart(cluster) if o.pin else None
            runs = [run_round(cluster, o, wl, rnd, console=console, sink=sink) for rnd in range(o.rounds)]
    return {
        "sessions": len(wl.tasks), "calls_per_run": wl.num_calls, "replicas": o.replicas, "rounds": o.rounds,
        "arrival": o.arrival, "speed": o.speed, "kv_blocks": o.kv_blocks, "block_size": 16, "seed": o.seed,
        "admission": o.admission, "postgres": o.postgres, "max_context_tokens": o.max_context, "pinned": pinned,
        "cpu_count": os.cpu_count(), "workload": wl.meta, "runs": runs, "ratios": [ratios(r) for r in runs],
    }


def run_round(cluster: LocalCluster, options: SessionsOptions, wl: RealWorkload, rnd: int, *, console: Console,
              sink: IO[str] | None) -> dict[str, dict[str, Any]]:
    """Round ``rnd``: every target in turn (the order rotated by the round), each task's calls to ``sink``."""
    targets = options.targets
    order = [*targets[rnd % len(targets):], *targets[:rnd % len(targets)]]
    run: dict[str, dict[str, Any]] = {}
    for target in order:
        with Progress(TextColumn(f"round {rnd + 1}/{options.rounds} {target:12}"), BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True) as bar:
            job = bar.add_task(target, total=wl.num_calls)

            def advance(n: int, bar: Progress = bar, job: TaskID = job) -> None:
                bar.update(job, completed=n)

            fig, tasks = one_run(cluster, target, wl, f"r{rnd}-{target}", progress=advance)
        run[target] = fig
        console.print(f"round {rnd + 1} {target}: {summary_line(fig)}")
        if sink is not None:
            for t in tasks:
                sink.write(json.dumps({"round": rnd, "target": target, **t.as_json()}) + "\n")
    return run


def summary_line(fig: dict[str, Any]) -> str:
    c, t = fig["call_ms"], fig["ttft_ms"]
    return (f"call mean {c['mean']} ms (p50 {c['p50']}, p99 {c['p99']}), TTFT mean {t['mean']} ms; "
            f"{fig['tasks_within_budget']}/{fig['tasks']} tasks in budget, {fig['refusals']} refusals, "
            f"replicas {fig['calls_per_replica']}, hits {fig['prefix_hit_ratio']}, load {fig['load_average_1m']}")


def render_table(res: dict[str, Any]) -> Table:
    """Every run side by side, with each target's ratio to round-robin of its round."""
    table = Table(title=f"{res['sessions']} agent sessions ({res['arrival']}), {res['replicas']} simulated replicas, "
                        f"{res['calls_per_run']} calls per run")
    for col in ("round", "target", "call mean / p50 / p99 ms", "x rr (mean)", "opening / after: call mean ms",
                "at replica: call / TTFT ms", "x rr",
                "TTFT mean / p50 / p99 ms",
                "in budget", "429s", "calls per replica", "prefix hits", "queue ms mean", "load"):
        table.add_column(col, justify="left" if col in ("target",) else "right")
    for i, (run, ratio) in enumerate(zip(res["runs"], res["ratios"], strict=True)):
        for name, fig in run.items():
            c, t = fig["call_ms"], fig["ttft_ms"]
            r, rr = ratio.get(name, {}).get("call_mean"), ratio.get(name, {}).get("replica_e2e_mean")
            at = fig["replica_side_ms"]
            table.add_row(str(i + 1), name, f"{c['mean']} / {c['p50']} / {c['p99']}", "-" if r is None else f"{r:.2f}",
                          f"{fig['call_ms_opening']['mean']} / {fig['call_ms_after_opening']['mean']}",
                          f"{at['e2e_mean']} / {at['ttft_mean']}", "-" if rr is None else f"{rr:.2f}",
                          f"{t['mean']} / {t['p50']} / {t['p99']}", f"{fig['tasks_within_budget']}/{fig['tasks']}",
                          str(fig["refusals"]), "/".join(map(str, fig["calls_per_replica"])),
                          "-" if fig["prefix_hit_ratio"] is None else f"{fig['prefix_hit_ratio']:.3f}",
                          "-" if fig["queue_ms"] is None else str(fig["queue_ms"]["mean"]),
                          "/".join(map(str, fig["load_average_1m"])))
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m taskplane.bench.agent_sessions", description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=72, help="agent tasks per run")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="runs per target, the targets' order rotated each round")
    p.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, from: {', '.join(TARGETS)}")
    p.add_argument("--arrival", choices=("burst", "phases"), default="burst",
                   help="burst: every session starts within --burst-s; phases: light (0.3x --rate) then heavy (1.6x)")
    p.add_argument("--burst-s", type=float, default=1.0)
    p.add_argument("--rate", type=float, default=3.0, help="tasks per second before the phase multiplier (phases)")
    p.add_argument("--speed", type=float, default=1.0, help="sim speed-up over its H100 timing model (1: GPU time)")
    p.add_argument("--kv-blocks", type=int, default=4096, help="KV blocks of 16 tokens per replica")
    p.add_argument("--max-context", type=int, default=4000,
                   help="a task ends before its context would pass this many tokens (the pools allow 8192)")
    p.add_argument("--pin", action="store_true",
                   help="the gateway on a core of its own, the replicas and the client on the others")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-admission", action="store_true", help="the gateway without admission control")
    p.add_argument("--postgres", action="store_true",
                   help="an embedded Postgres for the gateway's attempt rows, as `taskplane dev up` runs it (its CPU then includes the cost writer)")
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    p.add_argument("--calls-out", type=Path, help="write every task and its calls as JSON lines here")
    args = p.parse_args(argv)
    console = Console(stderr=True)
    options = SessionsOptions(
        sessions=args.sessions, replicas=args.replicas, rounds=args.rounds,
        targets=tuple(t.strip() for t in args.targets.split(",") if t.strip()), seed=args.seed,
        arrival=args.arrival, burst_s=args.burst_s, rate_per_s=args.rate, speed=args.speed,
        kv_blocks=args.kv_blocks, max_context=args.max_context, admission=not args.no_admission, pin=args.pin,
        postgres=args.postgres)
    res = bench(options, calls_out=args.calls_out, console=console)
    Console(width=200).print(render_table(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
