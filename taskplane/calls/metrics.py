"""The gateway's Prometheus metrics (served on ``/metrics``).

On a gateway with auth on, ``/metrics`` without the admin token leaves out every series
labelled by tenant (``exposition(..., tenants=False)``): the page stays scrapeable by a
plain Prometheus, but does not tell whoever can reach it each tenant's name and traffic.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector


class GatewayMetrics:
    """One registry per gateway app so several gateways can live in one test process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("taskplane_gateway_requests_total", "Calls answered, by outcome",
                                ["model", "outcome"], registry=r)
        self.attempts = Counter("taskplane_gateway_attempts_total", "Upstream attempts, by replica and outcome",
                                ["replica", "outcome"], registry=r)
        self.cost_rows = Counter("taskplane_gateway_cost_rows_total", "Attempt rows handed to the cost writer, by outcome",
                                 ["outcome"], registry=r)
        self.retries = Counter("taskplane_gateway_retries_total", "Attempts retried on another replica", registry=r)
        #: ext_proc messages and streams the endpoint picker received (plain counts it bumps per
        #: message, exported at scrape time: a Prometheus counter's ``inc`` cost more)
        self.epp_messages: dict[str, int] = {}
        self.epp_streams: dict[str, int] = {}
        r.register(_Counts("taskplane_epp_messages", "ext_proc messages the endpoint picker received, by phase",
                           "phase", self.epp_messages))
        r.register(_Counts("taskplane_epp_streams", "ext_proc streams Envoy opened to the endpoint picker, by taskplane "
                           "filter (route, answers; empty: a GIE-style filter)", "exchange", self.epp_streams))
        self.cache_hits = Counter("taskplane_gateway_response_cache_hits_total", "Calls served by the exact response cache", registry=r)
        self.latency = Histogram("taskplane_gateway_request_seconds", "End-to-end call latency at the gateway",
                                 ["model"], registry=r,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.ttft = Histogram("taskplane_gateway_ttft_seconds", "Time to first token through the gateway",
                              ["model"], registry=r,
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.queue = Histogram("taskplane_gateway_queue_seconds", "Time held by admission control", registry=r)
        self.queued = Gauge("taskplane_gateway_queued_calls", "Calls held by admission control now (demand the "
                            "replicas have no room for), per pool and priority band", ["model", "band"], registry=r)
        self.cost = Counter("taskplane_gateway_cost_usd_total", "Attributed cost of all attempts", ["tenant"], registry=r)
        self.inflight = Gauge("taskplane_gateway_inflight", "Calls in flight per replica", ["replica"], registry=r)
        self.healthy = Gauge("taskplane_gateway_replica_healthy", "1 when the replica is healthy", ["replica"], registry=r)
        self.outbox_unwritable = Gauge(
            "taskplane_gateway_outbox_unwritable", "1 while the cost writer's outbox cannot be written (rows go straight "
            "to Postgres, or calls are refused with 503 if that fails too)", registry=r)
        self.rows_direct = Counter("taskplane_gateway_rows_direct_total",
                                   "Attempt rows written straight to Postgres because the outbox was unwritable", registry=r)
        self.rows_lost = Counter("taskplane_gateway_rows_not_stored_total",
                                 "Attempt rows neither the outbox nor Postgres took (logged as cost_row_not_stored)",
                                 registry=r)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)`` (label values in the metric's order), remembered: the
        lookup cost 5-12 microseconds, and a call made nine of them. Not for a metric whose
        series are ever removed or cleared (the remembered child would no longer be exported)."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found


class _Counts(Collector):
    """A counter family read at scrape time from a dict its owner bumps (label value -> count)."""

    def __init__(self, name: str, documentation: str, label: str, counts: dict[str, int]) -> None:
        self.name, self.documentation, self.label, self.counts = name, documentation, label, counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, n in sorted(self.counts.items()):
            family.add_metric([value], n)
        yield family


class _WithoutTenants(Collector):
    """The families of some registries, without their tenant-labelled samples."""

    def __init__(self, registries: Iterable[CollectorRegistry]) -> None:
        self.registries = list(registries)

    def collect(self) -> Iterator[Metric]:
        for registry in self.registries:
            for family in registry.collect():
                if any("tenant" in s.labels for s in family.samples):
                    family.samples = [s for s in family.samples if "tenant" not in s.labels]
                yield family


def exposition(registries: Iterable[CollectorRegistry], *, tenants: bool) -> bytes:
    """The text exposition of ``registries``; ``tenants=False`` drops tenant-labelled series."""
    registries = list(registries)
    if tenants:
        return b"".join(generate_latest(r) for r in registries)
    view = CollectorRegistry(auto_describe=False)
    view.register(_WithoutTenants(registries))
    return generate_latest(view)
