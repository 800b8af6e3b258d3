"""One LLM call through the gateway: authenticate, validate, place, proxy, retry, cost,
record.

A replica failure before anything was streamed is retried on another replica inside
the gateway; every attempt — successful or not — becomes one ``AttemptRecord`` written
through the durable cost writer, keyed so that a retried activity never counts twice.
The call's intake lives in ``intake``, its attempts' rows in ``attempts``, the relay of
a streamed answer in ``streaming``, the HTTP client side toward replicas in ``upstream``;
this module is the path between them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import httpx
import structlog
from fastapi.responses import JSONResponse, StreamingResponse

from taskplane.config import GatewayConfig
from taskplane.context import R_CACHED_TOKENS, R_COST, R_GPU, R_MODEL, R_QUEUE_MS, R_REPLICA
from taskplane.engines.registry import ReplicaRegistry, ReplicaState
from taskplane.errors import ErrorType, TaskplaneError
from taskplane.gateway import lost
from taskplane.gateway.attempts import Attempt, AttemptLedger, AttemptSink, response_headers
from taskplane.gateway.intake import Call, prepare_call
from taskplane.gateway.metrics import GatewayMetrics
from taskplane.gateway.openai_extra import PATHS, reply_usage
from taskplane.gateway.placement import Placer
from taskplane.gateway.streaming import StreamRelay
from taskplane.gateway.upstream import (
    ReplicaDown,
    UpstreamClients,
    engine_client_error,
    send_unless_down,
    upstream_body,
)
from taskplane.scheduler.types import Action, Decision
from taskplane.store.records import Outcome

log = structlog.get_logger(__name__)

MAX_TRIES = 3


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
        self.ledger = AttemptLedger(sink, metrics, placer, config.limits.request_timeout_s)
        self.upstream = UpstreamClients(config.limits.request_timeout_s)
        self._tenant_inflight: dict[str, int] = {}
        self._last_replica: OrderedDict[str, str] = OrderedDict()  # call id -> replica of its latest attempt

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
        return prepare_call(self.config, self.registry, kind, raw, headers, has_response_cache=self.response_cache is not None)

    async def handle(self, kind: str, raw: bytes, headers: Mapping[str, str]) -> Any:
        """The response to one OpenAI request: refusals and failures come back as the
        contract's error responses, never as exceptions."""
        try:
            call = self.prepare(kind, raw, headers)
        except TaskplaneError as exc:
            self.metrics.requests.labels(model="?", outcome=exc.error_type.value).inc()
            return error_response(exc)
        tenant_cfg = self.config.tenant(call.ctx.tenant)
        limit = tenant_cfg.max_concurrent if tenant_cfg else 1024
        if self._tenant_inflight.get(call.ctx.tenant, 0) >= limit:
            over = TaskplaneError(ErrorType.OVERLOADED, f"tenant {call.ctx.tenant} has {limit} calls in flight (its limit)", retry_after_s=1)
            await self.ledger.record_unplaced(call, over, Outcome.SHED)
            return error_response(over)
        self._tenant_inflight[call.ctx.tenant] = self._tenant_inflight.get(call.ctx.tenant, 0) + 1
        release = True
        try:
            if self.response_cache is not None and call.deterministic:
                cached = self.response_cache.get(self._cache_key(call))
                if cached is not None:
                    return await self._serve_cached(call, cached)
            result = await self._run(call)
            if isinstance(result, StreamingResponse):
                release = False  # the stream releases when it ends
            return result
        finally:
            if release:
                self._release_tenant(call)

    def _release_tenant(self, call: Call) -> None:
        """Free the tenant's in-flight slot (a stream frees it when it settles)."""
        self._tenant_inflight[call.ctx.tenant] -= 1

    def _cache_key(self, call: Call) -> str | None:
        assert self.response_cache is not None
        return self.response_cache.key(call.pool.model, {"_kind": call.kind, **call.body})

    async def _serve_cached(self, call: Call, cached: dict[str, Any]) -> JSONResponse:
        self.metrics.cache_hits.inc()
        self.metrics.requests.labels(model=call.pool.model, outcome="cached").inc()
        await self.ledger.record_cached(call)
        return JSONResponse(cached, headers={R_REPLICA: "response-cache", R_GPU: "none", R_CACHED_TOKENS: str(call.prompt_tokens),
                                             R_QUEUE_MS: "0", R_COST: "0", R_MODEL: call.pool.model})

    async def _place(self, call: Call, exclude: set[str]) -> tuple[Decision, float]:
        t0 = time.monotonic()
        call.request.now_s = t0
        decision = await self.placer.place(call.request, exclude=exclude)
        queue_ms = (time.monotonic() - t0) * 1000.0
        self.metrics.queue.observe(queue_ms / 1000.0)
        return decision, queue_ms

    def _previous_replica(self, call: Call) -> str | None:
        """Where an earlier attempt of this call went (the client retried: avoid it)."""
        if call.ctx.attempt <= 1 or not call.ctx.call_id:
            return None
        return self._last_replica.get(call.ctx.call_id)

    def _remember_replica(self, call: Call, replica: str) -> None:
        if not call.ctx.call_id:
            return
        self._last_replica[call.ctx.call_id] = replica
        self._last_replica.move_to_end(call.ctx.call_id)
        while len(self._last_replica) > 100_000:
            self._last_replica.popitem(last=False)

    async def _run(self, call: Call) -> Any:
        previous = self._previous_replica(call)
        exclude: set[str] = {previous} if previous else set()
        last_error: TaskplaneError | None = None
        for try_index in range(MAX_TRIES):
            decision, queue_ms = await self._place(call, exclude)
            if decision.action is Action.NO_REPLICA and previous in exclude and last_error is None:
                exclude.discard(previous)  # the previous replica is the only one left: better than none
                decision, queue_ms = await self._place(call, exclude)
            if decision.action is not Action.PLACE or decision.replica is None:
                exc = self._decision_error(decision, call)
                if last_error is not None and decision.action is Action.NO_REPLICA:
                    exc = TaskplaneError(ErrorType.NO_REPLICA, f"all replicas failed: {last_error.message}")
                outcome = Outcome.SHED if decision.action in (Action.SHED, Action.UNMEETABLE) else Outcome.ERROR
                await self.ledger.record_unplaced(call, exc, outcome, try_index=try_index)
                self.metrics.requests.labels(model=call.pool.model, outcome=exc.error_type.value).inc()
                return error_response(exc)
            replica = self.registry.replicas.get(decision.replica)
            if replica is None:
                exclude.add(decision.replica)
                continue
            self._remember_replica(call, replica.name)
            outcome = await self._attempt(call, decision, replica, try_index, queue_ms)
            if isinstance(outcome, TaskplaneError):
                last_error = outcome
                exclude.add(replica.name)
                self.metrics.retries.inc()
                continue
            return outcome
        # every try failed, or named replicas that had just left the registry
        message = (f"{MAX_TRIES} replicas failed; last: {last_error.message}" if last_error is not None
                   else f"{MAX_TRIES} tries chose replicas that had left the pool")
        exc = TaskplaneError(ErrorType.NO_REPLICA, message, retry_after_s=1)
        if last_error is None:
            await self.ledger.record_unplaced(call, exc, Outcome.ERROR, try_index=MAX_TRIES - 1)
        self.metrics.requests.labels(model=call.pool.model, outcome="replica_error").inc()
        return error_response(exc)

    def _decision_error(self, d: Decision, call: Call) -> TaskplaneError:
        if d.action is Action.SHED:
            return TaskplaneError(ErrorType.OVERLOADED, d.reason or "overloaded: shed by admission control", retry_after_s=d.retry_after_s or 1.0)
        if d.action is Action.UNMEETABLE:
            return TaskplaneError(ErrorType.DEADLINE_UNMEETABLE, d.reason or f"no replica can answer within the {call.ctx.budget_ms:.0f} ms budget")
        return TaskplaneError(ErrorType.NO_REPLICA, d.reason or f"no healthy replica serves {call.pool.model}", retry_after_s=1.0)

    async def _attempt(self, call: Call, decision: Decision, replica: ReplicaState, try_index: int, queue_ms: float) -> Any:
        """One upstream attempt. Returns a response, or a TaskplaneError when a retry elsewhere may help."""
        model = decision.model or call.pool.model
        path = PATHS.get(call.kind, PATHS["chat"])
        url = replica.config.url + path
        started_wall = datetime.now(UTC)
        t0 = time.monotonic()
        replica.inflight += 1
        # Prefill work queued on the replica: the tokens it must compute (not those it holds
        # in its prefix cache), until the first token shows they are done (as the simulator
        # and the scheduler's own accounting count it; whole prompts of calls already
        # decoding made a busy replica look seconds behind).
        block = replica.config.block_size or replica.block_size or call.request.block_size
        pending_prefill = max(call.prompt_tokens - decision.cached_blocks * block, 0)
        replica.inflight_prompt_tokens += pending_prefill
        replica.inflight_decode_tokens += call.max_tokens
        attempt = Attempt(call, decision, replica, try_index, queue_ms, model, started_wall, t0, batch_start=replica.inflight)
        self.metrics.inflight.labels(replica=replica.name).set(replica.inflight)
        done = False
        prefilling = True

        def prefilled() -> None:
            nonlocal prefilling
            if prefilling:
                prefilling = False
                replica.inflight_prompt_tokens -= pending_prefill

        def finish() -> int:
            nonlocal done
            if done:
                return replica.inflight
            done = True
            prefilled()
            batch_end = replica.inflight
            replica.inflight -= 1
            replica.inflight_decode_tokens -= call.max_tokens
            self.metrics.inflight.labels(replica=replica.name).set(replica.inflight)
            return batch_end

        try:
            await self.ledger.note_open(attempt)
            client = self.upstream.client_for(replica)
            req = client.build_request("POST", url, json=upstream_body(call, model))
            resp = await send_unless_down(client, req, replica)
            replica.saw_progress()
        except asyncio.CancelledError:
            await self.ledger.record_cancelled(attempt, finish())
            raise
        except (httpx.HTTPError, OSError, ReplicaDown) as exc:
            batch_end = finish()
            # refused/reset/down: the replica is gone; a timeout may only be overload
            self.registry.mark_failure(replica.name, hard=not isinstance(exc, httpx.TimeoutException))
            err = TaskplaneError(ErrorType.REPLICA_ERROR, f"replica {replica.name} failed: {type(exc).__name__}")
            await self.ledger.record_failed(attempt, err, batch_end, timeout=isinstance(exc, httpx.TimeoutException))
            return err
        if resp.status_code >= 500 or resp.status_code == 429:
            await resp.aread()
            await resp.aclose()
            batch_end = finish()
            self.registry.mark_failure(replica.name, hard=False)
            err = TaskplaneError(ErrorType.REPLICA_ERROR, f"replica {replica.name} answered {resp.status_code}")
            await self.ledger.record_failed(attempt, err, batch_end)
            return err
        if resp.status_code >= 400:
            body = await resp.aread()
            await resp.aclose()
            batch_end = finish()
            err = engine_client_error(resp.status_code, body)
            await self.ledger.record_failed(attempt, err, batch_end)
            self.metrics.requests.labels(model=call.pool.model, outcome=err.error_type.value).inc()
            return error_response(err)
        self.registry.mark_success(replica.name)
        if call.stream:
            relay = StreamRelay(attempt, resp, ledger=self.ledger, registry=self.registry, finish=finish,
                                prefilled=prefilled, release=lambda: self._release_tenant(call))
            return relay.response()
        try:
            raw = await resp.aread()
            data = json.loads(raw)
            usage = reply_usage(call.kind, data)
        except asyncio.CancelledError:
            await resp.aclose()
            await self.ledger.record_cancelled(attempt, finish())
            raise
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            await resp.aclose()
            batch_end = finish()
            self.registry.mark_failure(replica.name, hard=False)
            err = TaskplaneError(ErrorType.REPLICA_ERROR, f"replica {replica.name} sent a broken response: {type(exc).__name__}")
            await self.ledger.record_failed(attempt, err, batch_end)
            return err
        await resp.aclose()
        batch_end = finish()
        total_ms = attempt.elapsed_ms()
        rec = self.ledger.success(attempt, total_ms, None, usage, batch_end)
        await self.ledger.write(rec)
        self.ledger.completed(call, decision, ok=True, ttft_ms=None, total_ms=total_ms, cached=rec.cached_tokens,
                              completion=rec.completion_tokens, batch=max(attempt.batch_start, batch_end))
        if self.response_cache is not None and call.deterministic:
            self.response_cache.put(self._cache_key(call), data)
        return JSONResponse(data, headers=response_headers(replica, rec, queue_ms, model))

