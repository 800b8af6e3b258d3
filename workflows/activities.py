"""The built-in activities: ``llm_call`` (one gateway request per attempt) and
``task_record`` (the task's row in Postgres).

``llm_call`` is the only place an agent's LLM call touches the network. It reads the task
context from the Temporal header (the interceptor put it in ``current_context``), adds
the attempt number and a stable call id, sends the request with httpx - whose own
retries are off, Temporal's activity retry is the one retry loop - and turns gateway
errors into typed activity failures (:mod:`taskplane.sdk.retry`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError

from taskplane import context as hdr
from taskplane.sdk import retry
from taskplane.sdk.control import task_context
from taskplane.sdk.state import TaskContext
from taskplane.sdk.types import LlmRequest, LlmResponse, TaskRowInput, TaskRowResult

log = structlog.get_logger("taskplane.worker")

#: A call slower than this starts heartbeating (see HEARTBEAT_TIMEOUT in taskplane.sdk.llm).
HEARTBEAT_EVERY_S = 3.0

_PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


class TaskRows(Protocol):
    """Where task rows go (Postgres through the store's writer, or nowhere)."""

    async def record(self, row: TaskRowInput) -> TaskRowResult: ...

    async def close(self) -> None: ...


def http_client() -> httpx.AsyncClient:
    """One pooled client per worker; no transport retries (Temporal retries), no proxies.

    With auth on (the default outside ``taskplane dev``) the gateway needs the tenant's
    API key: ``TASKPLANE_API_KEY`` is sent as ``Authorization: Bearer``.
    """
    key = os.environ.get("TASKPLANE_API_KEY")
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(retries=0),
        limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        timeout=httpx.Timeout(120.0, connect=5.0),
        trust_env=False,
        headers={"Authorization": f"Bearer {key}"} if key else None,
    )


def _float(headers: httpx.Headers, name: str) -> float:
    try:
        return float(headers.get(name) or 0.0)
    except ValueError:
        return 0.0


class TaskplaneActivities:
    """The worker's built-in activities and the resources they share."""

    def __init__(self, gateway_url: str | None, rows: TaskRows, http: httpx.AsyncClient | None = None) -> None:
        self.gateway_url = gateway_url.rstrip("/") if gateway_url else None
        self.rows = rows
        self.http = http or http_client()

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.rows.close()

    @activity.defn(name="llm_call")
    async def llm_call(self, req: LlmRequest) -> LlmResponse:
        """One attempt of one LLM call: context headers in, response and cost headers out."""
        if not self.gateway_url:
            raise ApplicationError(
                "this worker has no gateway URL; start it with --gateway-url or TASKPLANE_GATEWAY_URL",
                type="invalid_request", non_retryable=True,
            )
        info = activity.info()
        ctx = task_context() or TaskContext(task_id=info.workflow_id or "unknown", agent=info.workflow_type or "")
        now = datetime.now(UTC)
        call = ctx.call_context(now=now, attempt=info.attempt)
        budget_ms = ctx.budget_ms(now)
        if budget_ms is not None and budget_ms <= 0:
            raise ApplicationError(
                f"task deadline {ctx.deadline} passed before LLM step {ctx.step} (attempt {info.attempt}) could start",
                type=retry.DEADLINE_EXCEEDED, non_retryable=True,
            )
        timeout_s = req.timeout_s if budget_ms is None else max(min(req.timeout_s, budget_ms / 1000.0), 0.001)
        url = self.gateway_url + _PATHS.get(req.kind, _PATHS["chat"])
        started = time.time()
        t0 = time.perf_counter()
        try:
            resp = await _with_heartbeats(self.http.post(
                url, json=req.body, headers=call.to_headers(),
                timeout=httpx.Timeout(timeout_s, connect=min(5.0, timeout_s)),
            ), ctx.step)
        except httpx.TimeoutException as exc:
            if budget_ms is not None and timeout_s * 1000.0 >= budget_ms - 1:
                raise ApplicationError(
                    f"LLM step {ctx.step} ran past the task deadline {ctx.deadline}",
                    type=retry.DEADLINE_EXCEEDED, non_retryable=True,
                ) from exc
            raise ApplicationError(f"gateway timeout after {timeout_s:.1f}s: {exc!r}", type=retry.TIMEOUT) from exc
        except httpx.TransportError as exc:
            raise ApplicationError(f"cannot reach the gateway at {url}: {exc!r}", type=retry.CONNECTION_ERROR) from exc
        http_ms = (time.perf_counter() - t0) * 1000.0
        ended = time.time()
        body: Any
        try:
            body = resp.json()
        except ValueError:
            body = resp.text[:500]
        if resp.status_code >= 400:
            after = ctx.budget_ms(datetime.now(UTC))
            raise retry.error_from_response(resp.status_code, body, resp.headers.get("retry-after"), budget_ms=after)
        if not isinstance(body, dict):
            raise ApplicationError(f"gateway returned a non-JSON body: {str(body)[:200]}", type=retry.HTTP_ERROR)
        return _response(body, resp.headers, ctx, call.call_id, info.attempt, http_ms, started, ended)

    @activity.defn(name="task_record")
    async def task_record(self, row: TaskRowInput) -> TaskRowResult:
        """Upsert the task row (idempotent: keyed by task id)."""
        return await self.rows.record(row)


async def _with_heartbeats(request: Coroutine[Any, Any, httpx.Response], step: int) -> httpx.Response:
    """Await the gateway, heartbeating every few seconds once the call is slow.

    Fast calls send no heartbeat (no extra round trip); a slow one tells Temporal the
    worker is alive, so a worker that dies mid-call is noticed within the heartbeat
    timeout instead of the call's whole timeout, and the call is retried elsewhere.
    """
    send = asyncio.ensure_future(request)
    try:
        while True:
            done, _ = await asyncio.wait({send}, timeout=HEARTBEAT_EVERY_S)
            if done:
                return send.result()
            activity.heartbeat(step)
    finally:
        if not send.done():
            send.cancel()


def _response(
    body: dict[str, Any], headers: httpx.Headers, ctx: TaskContext, call_id: str | None,
    attempt: int, http_ms: float, started: float, ended: float,
) -> LlmResponse:
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    cached_header = headers.get(hdr.R_CACHED_TOKENS)
    cached = int(float(cached_header)) if cached_header else int(details.get("cached_tokens") or 0)
    out = LlmResponse(
        response=body, step=ctx.step, attempt=attempt, call_id=call_id,
        model=headers.get(hdr.R_MODEL) or body.get("model"),
        replica=headers.get(hdr.R_REPLICA), gpu=headers.get(hdr.R_GPU),
        cached_tokens=cached,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        queue_ms=_float(headers, hdr.R_QUEUE_MS), cost_usd=_float(headers, hdr.R_COST),
        http_ms=http_ms, started_at_s=started, ended_at_s=ended,
    )
    where = f"{out.replica or 'replica ?'}" + (f" ({out.gpu})" if out.gpu else "")
    out.summary = (
        f"{out.model} on {where} · {out.prompt_tokens}+{out.completion_tokens} tok "
        f"({out.cached_tokens} cached) · ${out.cost_usd:.6f} · {http_ms:.0f} ms"
        + (f" · attempt {attempt}" if attempt > 1 else "")
    )
    return out
