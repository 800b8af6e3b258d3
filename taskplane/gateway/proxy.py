"""One LLM call through the Python proxy: the HTTP side of ``calls.lifecycle.AttemptLifecycle``.

Intake, admission, placement, the response cache and the settling of attempts (rows,
counters, the scheduler's feedback) live in ``taskplane.calls``, which the Envoy endpoint
picker drives too; this module adds what only a proxy does: the retry loop over
replicas, the upstream request (``upstream``), the relay of a streamed answer
(``streaming``). A replica failure before anything was streamed
is retried on another replica; every attempt, successful or not, becomes one row.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import structlog
from fastapi.responses import JSONResponse, StreamingResponse

from taskplane.api.errors import error_response
from taskplane.calls import failures
from taskplane.calls.attempts import response_headers
from taskplane.calls.bodies import sent_adapter, upstream_body
from taskplane.calls.disagg import PREFILLER_HEADER, prefiller_host_port
from taskplane.calls.failures import Failure
from taskplane.calls.intake import Call
from taskplane.calls.lifecycle import Choice, Tries
from taskplane.calls.openai_extra import PATHS
from taskplane.calls.service import CallService
from taskplane.context import R_CACHED_TOKENS, R_COST, R_GPU, R_MODEL, R_QUEUE_MS, R_REPLICA
from taskplane.errors import TaskplaneError
from taskplane.gateway.streaming import StreamRelay
from taskplane.gateway.upstream import (
    AttemptFailed,
    UpstreamClients,
    open_response,
    read_completion,
)

log = structlog.get_logger(__name__)


class Proxy:
    """The Python proxy over one ``CallService``: the calls it relays to replicas itself."""

    def __init__(self, calls: CallService) -> None:
        self.calls = calls
        self.lifecycle = calls.lifecycle
        self.metrics = calls.metrics
        self.upstream = UpstreamClients(calls.config.limits.request_timeout_s)

    async def close(self) -> None:
        await self.upstream.close()

    # ---- the call -------------------------------------------------------
    async def answer(self, kind: str, raw: bytes, headers: Mapping[str, str]) -> Any:
        """The response to one OpenAI request: refusals and failures come back as the
        contract's error responses, never as exceptions."""
        try:
            call = self.calls.prepare(kind, raw, headers)
            await self.lifecycle.admit(call)
        except TaskplaneError as exc:
            return error_response(exc)
        leave = True
        try:
            cached = self.calls.cached_answer(call)
            if cached is not None:
                return await self._serve_cached(call, cached)
            result = await self._run(call)
            if isinstance(result, StreamingResponse):
                leave = False  # the stream gives the slot back when it settles
            return result
        finally:
            if leave:
                self.lifecycle.leave(call)

    async def _serve_cached(self, call: Call, cached: dict[str, Any]) -> JSONResponse:
        await self.calls.count_cache_hit(call)
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
            prefiller = prefiller_host_port(self.calls.registry, choice.decision)
            req = client.build_request("POST", replica.config.url + path, json=upstream_body(call, attempt.model),
                                       headers={PREFILLER_HEADER: prefiller} if prefiller else None)
            resp = await open_response(client, req, replica, sent_adapter(call, attempt.model))
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
        self.calls.keep_answer(call, data)
        return JSONResponse(data, headers=response_headers(replica, rec, choice.queue_ms, attempt.model))
