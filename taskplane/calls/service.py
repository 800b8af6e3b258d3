"""One gateway's call machinery, whichever data plane carries the bytes.

``CallService`` holds what the Python proxy (``taskplane.gateway``) and the Envoy picker
(``taskplane.epp``) both drive: the registry, the placer, the attempt sink and its ledger,
the metrics, the exact response cache and the transport-neutral ``AttemptLifecycle``. The
HTTP API (``taskplane.api``) builds one per process; each data plane adds only how it
reaches replicas and how it answers the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taskplane.calls import lost
from taskplane.calls.attempts import AttemptSink
from taskplane.calls.intake import Call
from taskplane.calls.lifecycle import AttemptLifecycle
from taskplane.calls.metrics import GatewayMetrics
from taskplane.calls.placement import Placer
from taskplane.config import GatewayConfig
from taskplane.engines.registry import ReplicaRegistry


class CallService:
    """The shared state of one gateway and the steps of a call that do not depend on HTTP."""

    def __init__(
        self,
        config: GatewayConfig,
        registry: ReplicaRegistry,
        placer: Placer,
        sink: AttemptSink,
        metrics: GatewayMetrics,
        response_cache: Any | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.placer = placer
        self.sink = sink
        self.metrics = metrics
        self.response_cache = response_cache
        self.lifecycle = AttemptLifecycle(config, registry, placer, sink, metrics,
                                          has_response_cache=response_cache is not None)
        self.ledger = self.lifecycle.ledger

    async def record_lost_attempts(self) -> int:
        """Write the rows of attempts a killed predecessor on this outbox left in flight."""
        records = await lost.record_orphans(self.sink, self.ledger.write)
        for rec in records:
            self.metrics.cost.labels(tenant=rec.tenant).inc(rec.cost_usd)
        return len(records)

    def prepare(self, kind: str, raw: bytes, headers: Mapping[str, str]) -> Call:
        """The call behind one request, or the ``TaskplaneError`` that refuses it (see ``intake``)."""
        return self.lifecycle.prepare(kind, raw, headers)

    # ---- the exact response cache ------------------------------------------------
    def cached_answer(self, call: Call) -> dict[str, Any] | None:
        """The stored answer of an identical deterministic call, if the cache holds one."""
        if self.response_cache is None or not call.deterministic:
            return None
        cached: dict[str, Any] | None = self.response_cache.get(self._cache_key(call))
        return cached

    def keep_answer(self, call: Call, data: dict[str, Any]) -> None:
        """Store a deterministic call's answer for the next identical call."""
        if self.response_cache is not None and call.deterministic:
            self.response_cache.put(self._cache_key(call), data)

    async def count_cache_hit(self, call: Call) -> None:
        """A call answered from the cache: its counters and its row (no replica, no cost)."""
        self.metrics.cache_hits.inc()
        self.metrics.requests.labels(model=call.pool.model, outcome="cached").inc()
        await self.ledger.record_cached(call)

    def _cache_key(self, call: Call) -> str | None:
        assert self.response_cache is not None
        # an adapter's answer is not the base model's (nor another adapter's)
        model = call.pool.model if call.request.adapter is None else f"{call.pool.model}:{call.request.adapter}"
        key: str | None = self.response_cache.key(model, {"_kind": call.kind, **call.body})
        return key
