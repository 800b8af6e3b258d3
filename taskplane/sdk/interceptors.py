"""Interceptors that carry the task context in a Temporal header, so context travels on
its own: client start -> workflow -> activities, child workflows and continue-as-new.

The workflow side puts ``TaskRuntime.pending_header`` (what the SDK call just prepared)
or a snapshot of the task's context on every outgoing command; the receiving workflow
reads it in ``execute_workflow`` and activities read it in ``execute_activity`` (exposed
by ``taskplane.current_context()``). The client side adds the header that ``submit()``
prepared for the task it starts.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
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
