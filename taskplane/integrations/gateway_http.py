"""The HTTP client an adapted framework's model calls use: to the gateway, with the task's headers.

The framework's OpenAI client sends through this httpx client: its own retries are off
(``max_retries=0`` on the OpenAI client, ``retries=0`` here: Temporal's activity retry is
the one retry loop), no proxies from the environment, and every request gets the task
context of the activity it runs in (tenant, task, step, budget, sunk cost, attempt) as
the gateway's headers. What the gateway charged is collected for the twin activity
(:func:`charged_call`) to return to the workflow.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from temporalio import activity

from taskplane.context import R_COST
from taskplane.sdk.control import task_context

_CHARGED: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("taskplane_charged", default=None)

#: The base URL models are built with at import time, before the worker knows its gateway;
#: each request is sent to the worker's gateway instead (:func:`set_gateway`).
PLACEHOLDER_BASE = "http://taskplane-gateway/v1"
_GATEWAY: dict[str, str] = {}


def set_gateway(gateway_url: str | None) -> None:
    """Where this worker's framework model calls go (the worker's ``--gateway-url``)."""
    if gateway_url:
        _GATEWAY["url"] = gateway_url.rstrip("/")


async def _add_context(request: httpx.Request) -> None:
    if request.url.host == "taskplane-gateway":
        target = httpx.URL(gateway_base_url(_GATEWAY.get("url")))
        request.url = request.url.copy_with(scheme=target.scheme, host=target.host, port=target.port)
        request.headers["host"] = target.netloc.decode()
    ctx = task_context()
    if ctx is None or not activity.in_activity():
        return
    call = ctx.call_context(now=datetime.now(UTC), attempt=activity.info().attempt)
    request.headers.update(call.to_headers())


async def _note_cost(response: httpx.Response) -> None:
    charged = _CHARGED.get()
    if charged is not None:
        try:
            charged.append(float(response.headers.get(R_COST) or 0.0))
        except ValueError:
            pass


def gateway_http_client() -> httpx.AsyncClient:
    """An httpx client for a framework's OpenAI client: no retries, no env proxies, task headers."""
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(retries=0), trust_env=False,
        timeout=httpx.Timeout(120.0, connect=5.0),
        event_hooks={"request": [_add_context], "response": [_note_cost]},
    )


def gateway_base_url(gateway_url: str | None) -> str:
    """The OpenAI base URL of the gateway (``/v1``) from the worker's gateway URL."""
    url = (gateway_url or os.environ.get("TASKPLANE_GATEWAY_URL") or "").rstrip("/")
    if not url:
        from taskplane.errors import UserError

        raise UserError("the framework adapter needs the gateway URL: --gateway-url or TASKPLANE_GATEWAY_URL")
    return url + "/v1"


def api_key() -> str:
    """The tenant's gateway key (``TASKPLANE_API_KEY``); any string where auth is off (dev)."""
    return os.environ.get("TASKPLANE_API_KEY") or "taskplane-dev"


async def charged_call(fn: Callable[..., Awaitable[Any]], *args: Any) -> dict[str, Any]:
    """Run the framework's model activity and return its result with what the gateway charged."""
    charged: list[float] = []
    token = _CHARGED.set(charged)
    try:
        response = await fn(*args)
    finally:
        _CHARGED.reset(token)
    return {"response": response, "cost_usd": sum(charged), "attempt": activity.info().attempt}
