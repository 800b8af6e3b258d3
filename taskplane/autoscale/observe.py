"""Decisions and their reasons as Prometheus metrics and structured log lines."""

from __future__ import annotations

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from taskplane.autoscale.types import Plan, PoolSignals

log = structlog.get_logger("taskplane.autoscale")


class AutoscaleMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.actions = Counter("taskplane_autoscaler_actions", "replicas started, cordoned, uncordoned, drained",
                               ["pool", "autoscaler", "action"], registry=self.registry)
        self.replicas = Gauge("taskplane_autoscaler_replicas", "replicas by phase", ["pool", "phase"],
                              registry=self.registry)
        self.desired = Gauge("taskplane_autoscaler_desired_replicas", "the last plan's target", ["pool"],
                             registry=self.registry)
        self.workflows = Gauge("taskplane_autoscaler_workflows_in_flight", "live workflows seen", ["pool"],
                               registry=self.registry)

    def acted(self, pool: str, autoscaler: str, action: str, replica: str) -> None:
        """An action the actuator took on its own after a plan (``sleep``: a drained replica slept)."""
        self.actions.labels(pool, autoscaler, action).inc()
        log.info("autoscale_replica", pool=pool, autoscaler=autoscaler, action=action, replica=replica)

    def record(self, autoscaler: str, s: PoolSignals, plan: Plan) -> None:
        """Count the plan's actions and log it (a non-empty plan only) with its reasons."""
        self.desired.labels(s.pool).set(plan.desired)
        self.workflows.labels(s.pool).set(len(s.workflows))
        phases: dict[str, int] = {}
        for r in s.replicas:
            phases[r.phase.value] = phases.get(r.phase.value, 0) + 1
        for phase in ("starting", "ready", "cordoned", "draining", "sleeping"):
            self.replicas.labels(s.pool, phase).set(phases.get(phase, 0))
        if plan.empty:
            return
        for action, names in (("start", plan.start), ("cordon", plan.cordon), ("uncordon", plan.uncordon),
                              ("drain", plan.drain), ("wake", plan.wake)):
            if names:
                self.actions.labels(s.pool, autoscaler, action).inc(len(names))
        log.info("autoscale_plan", pool=s.pool, autoscaler=autoscaler, desired=plan.desired, start=plan.start,
                 cordon=plan.cordon, uncordon=plan.uncordon, drain=plan.drain, wake=plan.wake, grace_s=plan.grace_s,
                 reasons=plan.reasons, replicas=phases, workflows=len(s.workflows), queued=s.queued_requests)
