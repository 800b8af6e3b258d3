"""Interceptors that carry the task context in a Temporal header, so context travels on
its own: client start -> workflow -> activities, child workflows and continue-as-new.

The workflow side puts ``TaskRuntime.pending_header`` (what the SDK call just prepared)
or a snapshot of the task's context on every outgoing command; the receiving workflow
reads it in ``execute_workflow`` and activities read it in ``execute_activity`` (exposed
by ``taskplane.current_context()``). The client side adds the header that ``submit()``
prepared for the task it starts.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, NoReturn

from temporalio import client as tclient
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.worker import (
    ActivityInboundInterceptor,
    ContinueAsNewInput,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    Interceptor,
    StartActivityInput,
    StartChildWorkflowInput,
    StartLocalActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from taskplane.sdk.control import activity_context
from taskplane.sdk.state import HEADER_KEY, TaskContext

#: The context ``submit()`` wants on the workflow it is starting (read by the client interceptor).
START_CONTEXT: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "taskplane_start_context", default=None
)


def _with(headers: Mapping[str, Payload], ctx: TaskContext | None) -> Mapping[str, Payload]:
    if ctx is None:
        return headers
    return {**headers, HEADER_KEY: ctx.to_payload()}


def _read(headers: Mapping[str, Payload]) -> TaskContext | None:
    payload = headers.get(HEADER_KEY)
    return None if payload is None else TaskContext.from_payload(payload)


#: Model-call activities of agent frameworks -> taskplane's twin activity that makes the same
#: call and also returns what the gateway charged (``taskplane.integrations`` register them).
MODEL_CALLS: dict[str, str] = {}


def _model_call(outbound: WorkflowOutboundInterceptor, input: StartActivityInput, twin: str, rt: Any) -> Any:
    """A framework's model call as a taskplane LLM step: budget checked, step claimed, context
    header sent, and on return its cost and attempts added to the task (search attributes,
    outcome, budget guard) - the same book-keeping as ``llm.chat``."""
    rt.check_cost()
    budget_s = rt.budget_left()
    ctx = rt.next_llm_context(steps_remaining=None, allow_fallback=None)
    input.headers = _with(input.headers, ctx)
    ret_type = input.ret_type
    input.activity, input.ret_type = twin, None
    if budget_s is not None:
        cap = timedelta(seconds=budget_s)
        input.schedule_to_close_timeout = min(input.schedule_to_close_timeout or cap, cap)
    input.summary = f"LLM step {ctx.step} · {input.summary or twin}"
    rt.set_current(f"LLM step {ctx.step}: {twin}")
    handle = outbound.start_activity(input)

    async def finish() -> Any:
        out = await handle
        rt.add_call(float(out.get("cost_usd") or 0.0), int(out.get("attempt") or 1))
        rt.publish()
        rt.set_current(f"LLM step {ctx.step} done")
        rt.check_cost()
        if ret_type is None:
            return out.get("response")
        pc = workflow.payload_converter()
        return pc.from_payload(pc.to_payload(out.get("response")), ret_type)

    return asyncio.ensure_future(finish())


def _outgoing() -> TaskContext | None:
    """What the running agent wants to send: the prepared header, else a snapshot."""
    rt = getattr(workflow.instance(), "_tp", None)
    if rt is None:
        return None
    pending = rt.pending_header
    rt.pending_header = None
    return pending if pending is not None else rt.ctx.copy()


class _WorkflowOutbound(WorkflowOutboundInterceptor):
    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        twin = MODEL_CALLS.get(input.activity)
        rt = getattr(workflow.instance(), "_tp", None)
        if twin is not None and rt is not None:
            return _model_call(self.next, input, twin, rt)  # type: ignore[no-any-return]
        input.headers = _with(input.headers, _outgoing())
        return super().start_activity(input)

    def start_local_activity(self, input: StartLocalActivityInput) -> workflow.ActivityHandle[Any]:
        input.headers = _with(input.headers, _outgoing())
        return super().start_local_activity(input)

    async def start_child_workflow(self, input: StartChildWorkflowInput) -> workflow.ChildWorkflowHandle[Any, Any]:
        input.headers = _with(input.headers, _outgoing())
        return await super().start_child_workflow(input)

    def continue_as_new(self, input: ContinueAsNewInput) -> NoReturn:
        input.headers = _with(input.headers, _outgoing())
        super().continue_as_new(input)


class _WorkflowInbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_WorkflowOutbound(outbound))

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        ctx = _read(input.headers)
        instance = workflow.instance()
        if ctx is not None and hasattr(instance, "_tp_header"):
            instance._tp_header = ctx
        return await super().execute_workflow(input)


class _ActivityInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        with activity_context(_read(input.headers)):
            return await super().execute_activity(input)


class TaskplaneInterceptor(Interceptor):
    """The worker interceptor: context headers on the workflow and activity sides."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityInbound(next)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _WorkflowInbound


class _ClientOutbound(tclient.OutboundInterceptor):
    async def start_workflow(self, input: tclient.StartWorkflowInput) -> tclient.WorkflowHandle[Any, Any]:
        input.headers = _with(input.headers, START_CONTEXT.get())
        return await super().start_workflow(input)


class TaskplaneClientInterceptor(tclient.Interceptor):
    """The client interceptor: the header ``submit()`` prepared goes on the start request."""

    def intercept_client(self, next: tclient.OutboundInterceptor) -> tclient.OutboundInterceptor:
        return _ClientOutbound(next)
