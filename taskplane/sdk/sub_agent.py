"""A sub-agent: an agent awaited inside another agent runs as a child workflow (its own task).

The child gets its own task id (``<parent id>.<agent>-<n>``) and session, the parent's
tenant and priority, the tighter of the two deadlines and cost limits, and the parent's
spend so far; its spend is added to the parent's, whether it succeeds or fails.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import ApplicationError, ChildWorkflowError

from taskplane.sdk.convert import convert_value, return_hint
from taskplane.sdk.errors import DeadlineExceeded, SubAgentFailed, raise_if_cancelled
from taskplane.sdk.runtime import runtime
from taskplane.sdk.spec import AgentSpec, execution_timeout
from taskplane.sdk.start_attributes import start_memo, start_search_attributes
from taskplane.sdk.state import TaskContext, format_time, parse_time
from taskplane.sdk.types import AgentOutput


async def run_sub_agent(spec: AgentSpec, args: tuple[Any, ...]) -> Any:
    """Run agent ``spec`` as a child task of the running agent: its own task and session; the
    parent's tenant, priority and budgets."""
    rt = runtime(f"sub-agent {spec.name!r}")
    rt.budget_left()
    rt.check_cost()
    parent = rt.ctx
    n = parent.children
    parent.children = n + 1
    child_id = f"{parent.task_id}.{spec.name}-{n}"
    now = rt.now()
    deadlines = [d for d in (parse_time(parent.deadline), now + spec.deadline if spec.deadline else None) if d]
    limits = [
        x for x in (
            None if parent.max_cost_usd is None else max(parent.max_cost_usd - parent.sunk_cost_usd, 0.0),
            spec.max_cost_usd,
        ) if x is not None
    ]
    child_ctx = TaskContext(
        task_id=child_id, agent=spec.name, tenant=parent.tenant, priority=parent.priority,
        session_id=child_id, deadline=format_time(min(deadlines)) if deadlines else None,
        max_cost_usd=min(limits) if limits else None, expected_steps=spec.steps,
        inherited_cost_usd=parent.total_sunk_usd, started_at=format_time(now),
        parent_task_id=parent.task_id, root_task_id=parent.root_task_id or parent.task_id,
        allow_fallback=spec.allow_fallback or parent.allow_fallback,
    )
    rt.pending_header = child_ctx
    rt.set_current(f"sub-agent {spec.name} ({child_id})")
    try:
        out = await workflow.execute_child_workflow(
            spec.name, args=list(args), id=child_id, task_queue=workflow.info().task_queue,
            result_type=AgentOutput, memo=start_memo(child_ctx, args, spec.fn.__module__),
            search_attributes=TypedSearchAttributes(start_search_attributes(child_ctx)),
            static_summary=f"sub-agent {spec.name} of {parent.task_id}",
            execution_timeout=execution_timeout(parse_time(child_ctx.deadline), now),
        )
    except ChildWorkflowError as exc:
        cause = exc.cause
        details = cause.details[0] if isinstance(cause, ApplicationError) and cause.details else {}
        info = details if isinstance(details, dict) else {}
        cost = float(info.get("cost_usd") or 0.0)
        status = str(info.get("status") or ("cancelled" if isinstance(cause, asyncio.CancelledError) else "failed"))
        rt.add_child(cost, int(info.get("llm_calls") or 0), int(info.get("attempts") or 0))
        rt.publish()
        raise_if_cancelled(exc)
        message = str(info.get("message") or (cause.message if isinstance(cause, ApplicationError) else cause or exc))
        if status == "failed-deadline":
            # the child's own message already names it ("task <child_id> ran out of its deadline budget ...")
            raise DeadlineExceeded(message if child_id in message else f"sub-agent {child_id}: {message}") from None
        raise SubAgentFailed(child_id, status, message, cost) from None
    rt.add_child(out.cost_usd, out.llm_calls, out.attempts)
    rt.publish()
    rt.set_current(f"sub-agent {spec.name} done")
    rt.check_cost()
    return convert_value(out.result, return_hint(spec.fn))
