"""``taskplane autoscale kube``: taskplane's planner driving a vLLM workload in Kubernetes.

Every tick it reads the pods of the workload (the scale subresource's selector), the
gateway's view of them (``/admin/replicas``: healthy, calls in flight; the gateway's
discovery names replicas after their pods) and the demand only the gateway sees (its
``/metrics``: shed and held calls), plans with :class:`TaskplaneAutoscaler`, and acts
through :class:`KubeActuator`:

- start: ``spec.replicas`` up; the new pods are adopted as ``starting`` on the next tick
  and become ``ready`` when the gateway reports them healthy (the pod's readiness and the
  gateway's own scrape: the cold start);
- cordon and pre-drain: the pod is annotated ``taskplane.io/cordoned: "true"``; the
  gateway sends it no new session, the sessions last placed there keep coming (none
  re-prefills); the annotation goes when the pod is uncordoned or drained;
- drain: the pod is annotated ``taskplane.io/draining: "true"``; the gateway's pod
  discovery (``discovery: {source: pods}``) marks it draining, so it takes no new calls;
  once the gateway reports it unplaceable with no call in flight it is retired: asleep
  (the pool's ``sleep_level``; still annotated draining, so no scrape's lag can place a call
  on it) or removed (lowest deletion cost, then one replica fewer);
- wake: ``POST /wake_up`` through the pod proxy, then the draining annotation goes; it is
  ``ready`` again once the gateway sees it awake (the hot start);
- a sleeper left ``sleep_max_s`` asleep, or a pod stopped before it served: removed.

Calls in flight always finish: a pod is only put to sleep (``mode=wait``) or deleted after
the gateway has stopped placing on it and its calls are done. A restarted loop adopts the
pods as it finds them: annotated asleep ones as sleeping, the rest as starting until the
gateway reports them healthy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import structlog

from taskplane.autoscale.actuators.kube import SLEEP_LEVEL, KubeActuator, KubeError, KubeTarget
from taskplane.autoscale.actuators.signals import (
    ShedWindow,
    attach_live_sessions,
    gateway_demand,
    gateway_replicas,
    workflows_in_flight,
    write_fleet_hours,
)
from taskplane.autoscale.fleet import FleetBook
from taskplane.autoscale.observe import AutoscaleMetrics
from taskplane.autoscale.planner import PlannerConfig, TaskplaneAutoscaler
from taskplane.autoscale.types import (
    AgentProfile,
    Generation,
    Phase,
    Plan,
    PoolSignals,
    WorkflowSignal,
)
from taskplane.engines.kube_access import KubeAccess
from taskplane.engines.kube_replicas import CORDONED_ANNOTATION, DRAINING_ANNOTATION

log = structlog.get_logger("taskplane.autoscale")
DRAINING = DRAINING_ANNOTATION  # read by the gateway's pod discovery (engines/kube_replicas.py)
CORDONED = CORDONED_ANNOTATION


@dataclass(slots=True)
class KubeLoopConfig:
    gateway_url: str
    pool: str  # the model the gateway serves from this workload
    generation: Generation  # the workload's GPU, price, cold start and (sleep mode) wake time
    min_replicas: int = 1
    max_replicas: int = 8
    sleep_level: int = 0
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    tick_s: float = 1.0


class KubeLoop:
    """One pool's autoscaler against one Kubernetes workload (see the module docstring)."""

    def __init__(self, actuator: KubeActuator, gateway: httpx.AsyncClient, cfg: KubeLoopConfig, *,
                 metrics: AutoscaleMetrics | None = None, database: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.act, self.gateway, self.cfg = actuator, gateway, cfg
        self.book = FleetBook(cfg.pool, [cfg.generation], sleep_level=cfg.sleep_level)
        self.scaler = TaskplaneAutoscaler(cfg.planner)
        self.metrics = metrics or AutoscaleMetrics()
        self.database = database
        self.clock, self.t0 = clock, clock()
        self.epoch = datetime.now(UTC)
        self._unplaceable: set[str] = set()  # draining pods the gateway no longer places on
        self._cordoned: set[str] = set()  # pods annotated cordoned (no new sessions)
        self._sheds = ShedWindow()

    def now(self) -> float:
        return self.clock() - self.t0

    # ---------------------------------------------------------------- observe
    async def _adopt(self, now: float) -> None:
        """The book follows the workload's pods: new ones are adopted, vanished ones closed."""
        pods = {p["metadata"]["name"]: p for p in await self.act.pods()
                if not p["metadata"].get("deletionTimestamp")}
        gpu = self.cfg.generation.gpu
        for name, pod in pods.items():
            asleep = SLEEP_LEVEL in (pod["metadata"].get("annotations") or {})
            known = self.book.replicas.get(name)
            if known is not None:
                if asleep and known.phase is Phase.STARTING:  # a wake that failed: wake it again next plan
                    known.phase, known.phase_since_s = Phase.SLEEPING, now
                continue
            self.book.provision(gpu, now, name=name)
            if asleep:
                r = self.book.replicas[name]
                r.phase, r.phase_since_s = Phase.SLEEPING, now
            log.info("autoscale_pod_adopted", pod=name, phase=self.book.replicas[name].phase.value)
        for name in [n for n in self.book.replicas if n not in pods]:
            self.book.stopped(name, now, reason="pod gone")
            self._unplaceable.discard(name)

    async def _observe(self, now: float) -> dict[str, dict[str, Any]]:
        admin = await gateway_replicas(self.gateway, self.cfg.gateway_url)
        for name, r in self.book.replicas.items():
            a = admin.get(name)
            if a is None:
                continue
            r.num_running = max(int(a.get("inflight", 0)), int(a.get("num_running", 0)))
            r.num_waiting = int(a.get("num_waiting", 0))
            r.kv_usage = float(a.get("kv_usage", 0.0) or 0.0)
            healthy = bool(a.get("healthy")) and not a.get("sleeping")
            if r.phase is Phase.STARTING and healthy:
                self.book.mark_ready(name, now)
            elif r.phase is Phase.DRAINING and not healthy:
                self._unplaceable.add(name)  # the gateway has stopped placing there
        return admin

    async def _signals(self, now: float) -> PoolSignals:
        demand = await gateway_demand(self.gateway, self.cfg.gateway_url, self.cfg.pool)
        held = demand.queued if demand is not None else 0
        workflows: list[WorkflowSignal] = []
        profiles: dict[str, AgentProfile] = {}
        if self.database is not None:
            workflows, profiles = await workflows_in_flight(self.database)
        attach_live_sessions(self.book, workflows)
        ready = any(r.phase is Phase.READY for r in self.book.replicas.values())
        return PoolSignals(pool=self.cfg.pool, now_s=now, replicas=list(self.book.replicas.values()),
                           generations=[self.cfg.generation], min_replicas=self.cfg.min_replicas,
                           max_replicas=self.cfg.max_replicas, queued_requests=self._sheds.recent(now, demand) + held,
                           held_requests=0 if ready else held, workflows=workflows, profiles=profiles)

    # ---------------------------------------------------------------- act
    async def tick(self) -> Plan:
        """One observe-plan-act round; returns the plan it carried out."""
        now = self.now()
        await self._adopt(now)
        await self._observe(now)
        s = await self._signals(now)
        plan = self.scaler.plan(s)
        self.metrics.record(self.scaler.name, s, plan)
        if plan.start:  # Kubernetes names the pods: they are adopted on the next tick
            await self.act.start(len(plan.start))
        acts = self.book.apply(dataclasses.replace(plan, start=[]), now)
        await self._publish_cordons()
        for pod in acts.unplaceable:
            await self.act.annotate(pod, {DRAINING: "true"})
        for pod in acts.wake:
            await self.act.wake(pod)
            await self.act.annotate(pod, {DRAINING: None})
        for pod, _kill in acts.stop:
            await self._remove(pod, now, "asleep too long" if self.book.replicas[pod].phase is Phase.SLEEPING
                               else "stopped before it served")
        for pod, _kill in self.book.due(now):
            if pod not in self._unplaceable:  # the gateway may still place a call there
                continue
            self._unplaceable.discard(pod)
            try:
                slept = await self.act.retire(pod) == "slept"
            except KubeError as exc:  # the engine refused to sleep (no sleep mode): remove the pod instead
                log.warning("autoscale_sleep_refused", pod=pod, error=str(exc))
                await self.act.stop(pod)
                slept = False
            if slept:
                self.book.slept(pod, now)
                self.metrics.acted(self.cfg.pool, self.scaler.name, "sleep", pod)
            else:
                self.book.stopped(pod, now, reason="drained")
        if self.database is not None:
            await write_fleet_hours(self.database, self.book, self.epoch)
        return plan

    async def _publish_cordons(self) -> None:
        """Cordoned and pre-drained pods annotated ``taskplane.io/cordoned`` (the gateway's
        pod discovery sends them no new session), the annotation gone from the others."""
        closed = set(self.book.closed_to_new_sessions())
        for pod in closed - self._cordoned:
            await self.act.annotate(pod, {CORDONED: "true"})
        for pod in self._cordoned - closed:
            if pod in self.book.replicas:
                await self.act.annotate(pod, {CORDONED: None})
        self._cordoned = closed

    async def _remove(self, pod: str, now: float, reason: str) -> None:
        await self.act.stop(pod)
        self.book.stopped(pod, now, reason=reason)
        log.info("autoscale_replica_stopped", replica=pod, reason=reason)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until ``stop`` is set; a failed tick (the API server away a moment) is logged."""
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("autoscale_tick_failed")
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.cfg.tick_s)
            except TimeoutError:
                pass


def kube_client(access: KubeAccess) -> httpx.AsyncClient:
    """An API server client with the pod's service-account credentials (the token re-read on
    every request, since bound tokens rotate), as the gateway's discovery uses them."""

    async def credentials(request: httpx.Request) -> None:
        request.headers.update(access.headers())

    return httpx.AsyncClient(base_url=access.base_url, verify=access.verify, timeout=httpx.Timeout(30.0),
                             event_hooks={"request": [credentials]})


async def serve(loop_cfg: KubeLoopConfig, access: KubeAccess, target: KubeTarget, *, metrics_port: int | None = None,
                database_url: str | None = None, admin_token: str | None = None) -> None:
    """Run the loop until SIGTERM/SIGINT (``taskplane autoscale kube``)."""
    import signal

    from prometheus_client import start_http_server

    metrics = AutoscaleMetrics()
    if metrics_port:
        start_http_server(metrics_port, registry=metrics.registry)
    database = None
    if database_url:
        from taskplane.store import db

        database = db.create_engine(database_url)
    stop = asyncio.Event()
    running = asyncio.get_running_loop()
    running.add_signal_handler(signal.SIGTERM, stop.set)
    running.add_signal_handler(signal.SIGINT, stop.set)
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    async with kube_client(access) as kube, httpx.AsyncClient(headers=headers) as gateway:
        act = KubeActuator(kube, target, sleep_level=loop_cfg.sleep_level)
        try:
            await KubeLoop(act, gateway, loop_cfg, metrics=metrics, database=database).run(stop)
        finally:
            if database is not None:
                await database.dispose()
