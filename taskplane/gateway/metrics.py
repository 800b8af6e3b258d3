"""The gateway's Prometheus metrics (served on ``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


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
        self.cache_hits = Counter("taskplane_gateway_response_cache_hits_total", "Calls served by the exact response cache", registry=r)
        self.latency = Histogram("taskplane_gateway_request_seconds", "End-to-end call latency at the gateway",
                                 ["model"], registry=r,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.ttft = Histogram("taskplane_gateway_ttft_seconds", "Time to first token through the gateway",
                              ["model"], registry=r,
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.queue = Histogram("taskplane_gateway_queue_seconds", "Time held by admission control", registry=r)
        self.cost = Counter("taskplane_gateway_cost_usd_total", "Attributed cost of all attempts", ["tenant"], registry=r)
        self.inflight = Gauge("taskplane_gateway_inflight", "Calls in flight per replica", ["replica"], registry=r)
        self.healthy = Gauge("taskplane_gateway_replica_healthy", "1 when the replica is healthy", ["replica"], registry=r)
