"""What an agent may ask of its task beyond LLM calls and tools: its context, a human's
approval, and a fresh history for long loops (continue-as-new).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from temporalio import workflow

from taskplane.context import CallContext
from taskplane.sdk.errors import AgentError, DeadlineExceeded
from taskplane.sdk.runtime import runtime
from taskplane.sdk.state import TaskContext
from taskplane.sdk.types import Decision

#: The task context of the activity running in this asyncio task (set by the interceptor).
_ACTIVITY_CONTEXT: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "taskplane_activity_context", default=None
)


@contextmanager
def activity_context(ctx: TaskContext | None) -> Iterator[None]:
    token = _ACTIVITY_CONTEXT.set(ctx)
    try:
        yield
    finally:
        _ACTIVITY_CONTEXT.reset(token)


def task_context() -> TaskContext | None:
    """The raw task context: the running agent's, or the one an activity received."""
    if workflow.in_workflow():
        rt = getattr(workflow.instance(), "_tp", None)
        return None if rt is None else rt.ctx.copy()
    return _ACTIVITY_CONTEXT.get()


def current_context() -> CallContext | None:
    """The context the next LLM call would carry (in an agent) or this call carries (in a
    step or the llm_call activity); None outside a task."""
    ctx = task_context()
    if ctx is None:
        return None
    if workflow.in_workflow():
        rt = runtime()
        ctx.steps_remaining = rt.steps_remaining(ctx.step, None)
        return ctx.call_context(now=workflow.now())
    return ctx.call_context(now=datetime.now(UTC))


async def approval(key: str, *, details: str = "", timeout: timedelta | None = None) -> Decision:
    """Wait until a person approves or rejects ``key`` (update ``decide`` or signal ``decision``).

    The task shows ``waiting-approval`` in the Temporal UI meanwhile. The wait is bounded
    by ``timeout`` and by the task's deadline; running out of the deadline ends the task
    as failed-deadline, running out of ``timeout`` raises ``TimeoutError``.
    """
    rt = runtime("approval()")
    if key in rt.decisions:
        return rt.decisions[key]
    budget_s = rt.budget_left()
    limit = timeout.total_seconds() if timeout is not None else None
    if budget_s is not None:
        limit = budget_s if limit is None else min(limit, budget_s)
    rt.pending_approvals[key] = details
    rt.publish(status="waiting-approval")
    rt.set_current(f"waiting for approval of {key!r}" + (f": {details}" if details else ""))
    try:
        await workflow.wait_condition(lambda: key in rt.decisions, timeout=limit)
    except TimeoutError:
        rt.pending_approvals.pop(key, None)
        budget = rt.budget_ms()
        if budget is not None and budget <= 0:
            raise DeadlineExceeded(f"no decision on {key!r} before the task's deadline") from None
        raise
    finally:
        rt.pending_approvals.pop(key, None)
        if rt.status == "waiting-approval" and not rt.pending_approvals:
            rt.publish(status="running")
    decision = rt.decisions[key]
    rt.set_current(f"{key!r} {'approved' if decision.approved else 'rejected'}")
    return decision


def should_continue_as_new() -> bool:
    """True when the task's history is long enough that the agent should call
    :func:`continue_as_new` (Temporal's suggestion, or the agent's ``history_limit``)."""
    rt = runtime("should_continue_as_new()")
    info = workflow.info()
    return info.is_continue_as_new_suggested() or info.get_current_history_length() >= rt.spec.history_limit


def continue_as_new(*args: Any) -> NoReturn:
    """Restart the agent with ``args`` and an empty history; the task id, session, step
    count, spend, budget and deadline carry over (in the context header)."""
    rt = runtime("continue_as_new()")
    if rt.pending_approvals:
        raise AgentError("continue_as_new() while an approval is pending; wait for the decision first")
    rt.set_current(f"continuing as new (run {rt.ctx.run + 1})")
    rt.pending_header = rt.ctx.copy(run=rt.ctx.run + 1)
    workflow.continue_as_new(args=list(args))
