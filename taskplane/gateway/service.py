"""One LLM call through the Python proxy: the HTTP side of ``lifecycle.AttemptLifecycle``.

Intake, admission, placement and the settling of attempts (rows, counters, the
scheduler's feedback) live in the transport-neutral lifecycle, which an Envoy endpoint
picker drives too; this module adds what only a proxy does: the retry loop over
replicas, the upstream request (``upstream``), the relay of a streamed answer
(``streaming``) and the response cache. A replica failure before anything was streamed
is retried on another replica; every attempt, successful or not, becomes one row.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import structlog
from fastapi.responses import JSONResponse, StreamingResponse

from taskplane.config import GatewayConfig
from taskplane.context import R_CACHED_TOKENS, R_COST, R_GPU, R_MODEL, R_QUEUE_MS, R_REPLICA
from taskplane.engines.registry import ReplicaRegistry
from taskplane.errors import TaskplaneError
from taskplane.gateway import failures, lost
from taskplane.gateway.attempts import AttemptSink, response_headers
from taskplane.gateway.failures import Failure
from taskplane.gateway.intake import Call
from taskplane.gateway.lifecycle import AttemptLifecycle, Choice, Tries
from taskplane.gateway.metrics import GatewayMetrics
from taskplane.gateway.openai_extra import PATHS
from taskplane.gateway.placement import Placer
from taskplane.gateway.streaming import StreamRelay
from taskplane.gateway.upstream import (
    AttemptFailed,
    UpstreamClients,
    open_response,
    read_completion,
    upstream_body,
)

log = structlog.get_logger(__name__)


def error_response(exc: TaskplaneError) -> JSONResponse:
    """The contract's error body (``{"error": {"type", "message"}}``), with Retry-After when shed."""
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


class Gateway:
    """The gateway's behaviour, independent of the web framework's routing."""

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
        self.upstream = UpstreamClients(config.limits.request_timeout_s)

    async def close(self) -> None:
        await self.upstream.close()

    async def record_lost_attempts(self) -> int:
        """Write the rows of attempts a killed predecessor on this outbox left in flight."""
        records = await lost.record_orphans(self.sink, self.ledger.write)
        for rec in records:
            self.metrics.cost.labels(tenant=rec.tenant).inc(rec.cost_usd)
        return len(records)

    # ---- the call -------------------------------------------------------
    def prepare(self, kind: str, raw: bytes, headers: Mapping[str, str]) -> Call:
        """The call behind one request, or the ``TaskplaneError`` that refuses it (see ``intake``)."""
        return self.lifecycle.prepare(kind, raw, headers)

    async def handle(self, kind: str, raw: bytes, headers: Mapping[str, str]) -> Any:
        """The response to one OpenAI request: refusals and failures come back as the
        contract's error responses, never as exceptions."""
        try:
            call = self.prepare(kind, raw, headers)
            await self.lifecycle.admit(call)
        except TaskplaneError as exc:
            return error_response(exc)
        leave = True
        try:
            if self.response_cache is not None and call.deterministic:
                cached = self.response_cache.get(self._cache_key(call))
                if cached is not None:
                    return await self._serve_cached(call, cached)
            result = await self._run(call)
            if isinstance(result, StreamingResponse):
                leave = False  # the stream gives the slot back when it settles
            return result
        finally:
            if leave:
                self.lifecycle.leave(call)

    def _cache_key(self, call: Call) -> str | None:
        assert self.response_cache is not None
        return self.response_cache.key(call.pool.model, {"_kind": call.kind, **call.body})

    async def _serve_cached(self, call: Call, cached: dict[str, Any]) -> JSONResponse:
        self.metrics.cache_hits.inc()
        self.metrics.requests.labels(model=call.pool.model, outcome="cached").inc()
        await self.ledger.record_cached(call)
        return JSONResponse(cached, headers={R_REPLICA: "response-cache", R_GPU: "none", R_CACHED_TOKENS: str(call.prompt_tokens),
                                             R_QUEUE_MS: "0", R_COST: "0", R_MODEL: call.pool.model})

    async def _run(self, call: Call) -> Any:
        """Try replicas until one answers, the request is refused, or the tries run out."""
        tries: Tries = self.lifecycle.tries(call)
        while True:
            choice = await self.lifecycle.choose(call, tries)
            if isinstance(choice, TaskplaneError):
                return error_response(choice)
            result = await self._attempt(call, choice, tries.index)
            if not isinstance(result, Failure):
                return result
            if not result.retry:
                return error_response(result.error)
            tries.failed(choice.replica.name, result.error)
            self.metrics.retries.inc()

    async def _attempt(self, call: Call, choice: Choice, try_index: int) -> Any:
        """One upstream attempt: the response, or the ``Failure`` it settled with."""
        replica = choice.replica
        attempt = await self.lifecycle.begin(call, choice.decision, replica, try_index=try_index,
                                             queue_ms=choice.queue_ms)
        path = PATHS.get(call.kind, PATHS["chat"])
        try:
            client = self.upstream.client_for(replica)
            req = client.build_request("POST", replica.config.url + path, json=upstream_body(call, attempt.model))
            resp = await open_response(client, req, replica)
            if call.stream:
                return StreamRelay(attempt, resp, lifecycle=self.lifecycle, leave=lambda: self.lifecycle.leave(call)).response()
            data, usage = await read_completion(resp, replica, call.kind)
        except AttemptFailed as exc:
            return await self.lifecycle.failed(attempt, exc.failure)
        except asyncio.CancelledError:
            await self.lifecycle.cancelled(attempt)
            raise
        except BaseException as exc:  # a bug of the gateway's: the attempt still ends once
            await self.lifecycle.failed(attempt, failures.internal(replica.name, type(exc).__name__))
            raise
        rec = await self.lifecycle.succeeded(attempt, usage)
        assert rec is not None  # settled here first
        if self.response_cache is not None and call.deterministic:
            self.response_cache.put(self._cache_key(call), data)
        return JSONResponse(data, headers=response_headers(replica, rec, choice.queue_ms, attempt.model))
