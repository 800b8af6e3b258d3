"""The context an LLM call carries from the agent to the scheduler, and its HTTP headers.

The SDK writes these headers and the gateway reads them; both use this module so the
header contract of DESIGN.md lives in exactly one place.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from pydantic import BaseModel, Field

from taskplane.errors import ErrorType, TaskplaneError
from taskplane.scheduler.types import Priority

H_TENANT = "x-taskplane-tenant"
H_TASK = "x-taskplane-task-id"
H_SESSION = "x-taskplane-session-id"
H_STEP = "x-taskplane-step"
H_STEPS_REMAINING = "x-taskplane-steps-remaining"
H_PRIORITY = "x-taskplane-priority"
H_BUDGET_MS = "x-taskplane-budget-ms"
H_SUNK_COST = "x-taskplane-sunk-cost-usd"
H_ALLOW_FALLBACK = "x-taskplane-allow-fallback"
# Extensions (documented in the README): identify the attempt so cost rows are idempotent.
H_AGENT = "x-taskplane-agent"
H_ATTEMPT = "x-taskplane-attempt"
H_CALL_ID = "x-taskplane-call-id"
# Extension (README): the tool (step) the task ran since its previous call, so the gateway
# knows this call ends a tool gap and which tool it was (KV lifetimes learn gaps per tool).
H_TOOL = "x-taskplane-tool"
#: Every taskplane header a call's request may carry (the gateway reads no others but
#: ``authorization``); Envoy's one-message exchange sends exactly these (``epp.envoy_names``).
CALL_HEADERS = (H_TENANT, H_TASK, H_SESSION, H_STEP, H_STEPS_REMAINING, H_PRIORITY, H_BUDGET_MS, H_SUNK_COST,
                H_ALLOW_FALLBACK, H_AGENT, H_ATTEMPT, H_CALL_ID, H_TOOL)

R_REPLICA = "X-Taskplane-Replica"
R_GPU = "X-Taskplane-Gpu"
R_CACHED_TOKENS = "X-Taskplane-Cached-Tokens"
R_QUEUE_MS = "X-Taskplane-Queue-Ms"
R_COST = "X-Taskplane-Cost-Usd"
R_MODEL = "X-Taskplane-Model"


class CallContext(BaseModel):
    """What the scheduler knows about a call beyond its body."""

    tenant: str = "default"
    task_id: str | None = None
    session_id: str | None = None
    step: int | None = Field(default=None, ge=0)
    steps_remaining: int | None = Field(default=None, ge=0)
    priority: Priority = Priority.STANDARD
    budget_ms: float | None = Field(default=None, ge=0)
    sunk_cost_usd: float = Field(default=0.0, ge=0)
    allow_fallback: bool = False
    agent: str | None = None
    attempt: int = Field(default=1, ge=1)
    call_id: str | None = None
    tool: str | None = None  # the tool the task ran since its previous call (X-Taskplane-Tool)

    @property
    def session_key(self) -> str | None:
        """The KV session: explicit session id, else the task id."""
        return self.session_id or self.task_id

    def to_headers(self) -> dict[str, str]:
        """Headers for the gateway; unset fields are left out."""
        h: dict[str, str] = {H_TENANT: self.tenant, H_PRIORITY: self.priority.value}
        if self.task_id:
            h[H_TASK] = self.task_id
        if self.session_id:
            h[H_SESSION] = self.session_id
        if self.step is not None:
            h[H_STEP] = str(self.step)
        if self.steps_remaining is not None:
            h[H_STEPS_REMAINING] = str(self.steps_remaining)
        if self.budget_ms is not None:
            h[H_BUDGET_MS] = str(int(self.budget_ms))
        if self.sunk_cost_usd:
            h[H_SUNK_COST] = f"{self.sunk_cost_usd:.10g}"
        if self.allow_fallback:
            h[H_ALLOW_FALLBACK] = "true"
        if self.agent:
            h[H_AGENT] = self.agent
        h[H_ATTEMPT] = str(self.attempt)
        if self.call_id:
            h[H_CALL_ID] = self.call_id
        if self.tool:
            h[H_TOOL] = self.tool
        return h


def _bad(name: str, value: str, want: str) -> TaskplaneError:
    return TaskplaneError(
        ErrorType.INVALID_REQUEST, f"header {name}: {value[:64]!r} is not {want}"
    )


def _int(headers: Mapping[str, str], name: str) -> int | None:
    raw = headers.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise _bad(name, raw, "a non-negative integer") from None
    if value < 0:
        raise _bad(name, raw, "a non-negative integer")
    return value


def _float(headers: Mapping[str, str], name: str) -> float | None:
    raw = headers.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        raise _bad(name, raw, "a non-negative number") from None
    if not math.isfinite(value) or value < 0:
        raise _bad(name, raw, "a non-negative number")
    return value


_CONTROL = re.compile("[\x00-\x1f]")


def _text(headers: Mapping[str, str], name: str, max_len: int = 256) -> str | None:
    raw = headers.get(name)
    if raw is None or raw == "":
        return None
    if len(raw) > max_len or _CONTROL.search(raw):
        raise _bad(name, raw, f"printable text of at most {max_len} characters")
    return raw


def parse_headers(headers: Mapping[str, str], *, tenant: str | None = None) -> CallContext:
    """Read the taskplane headers of a request; a malformed one raises ``invalid_request``.

    ``headers`` must be case-insensitive (Starlette's Headers are) or lower-cased.
    ``tenant`` overrides the tenant header when authentication found one.
    """
    prio_raw = headers.get(H_PRIORITY)
    if prio_raw:
        try:
            priority = Priority(prio_raw.strip().lower())
        except ValueError:
            raise _bad(H_PRIORITY, prio_raw, "one of critical, interactive, standard, batch") from None
    else:
        priority = Priority.STANDARD
    fb_raw = (headers.get(H_ALLOW_FALLBACK) or "false").strip().lower()
    if fb_raw not in {"true", "false", "1", "0", "yes", "no"}:
        raise _bad(H_ALLOW_FALLBACK, fb_raw, "true or false")
    attempt = _int(headers, H_ATTEMPT)
    return CallContext(
        tenant=tenant or _text(headers, H_TENANT) or "default",
        task_id=_text(headers, H_TASK),
        session_id=_text(headers, H_SESSION),
        step=_int(headers, H_STEP),
        steps_remaining=_int(headers, H_STEPS_REMAINING),
        priority=priority,
        budget_ms=_float(headers, H_BUDGET_MS),
        sunk_cost_usd=_float(headers, H_SUNK_COST) or 0.0,
        allow_fallback=fb_raw in {"true", "1", "yes"},
        agent=_text(headers, H_AGENT),
        attempt=max(attempt or 1, 1),
        call_id=_text(headers, H_CALL_ID),
        tool=_text(headers, H_TOOL),
    )
