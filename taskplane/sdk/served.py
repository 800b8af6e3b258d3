"""Is anyone serving this task? The check that turns a silent hang into an error.

A task submitted to a queue whose workers do not register its agent (or to a queue no
worker polls) would wait for ever: Temporal retries the workflow task and the client
sees ``running``. This looks at what Temporal knows - the task's first workflow task
and the queue's pollers - and names the agent, the queue and the command to run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import WorkflowHandle

#: How long a task may wait for its first workflow task before the queue's pollers are checked.
SERVED_WAIT_S = 5.0

_CLOSED = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
}


def fix_hint(queue: str, module: str | None) -> str:
    mod = module or "YOUR_MODULE"
    if queue == "taskplane":
        return f"`taskplane dev up --module {mod}` (dev stack) or `taskplane worker -m {mod}`"
    return f"`taskplane worker -m {mod} --task-queue {queue}`"


def unregistered_message(queue: str, agent: str | None, module: str | None) -> str:
    """The error of a task whose queue's workers do not register its agent."""
    what = f"agent {agent!r}" if agent else "this task's agent"
    return (f"no worker on task queue {queue!r} serves {what} (the workers there do not import its "
            f"module); run {fix_hint(queue, module)}")


async def _first_task(handle: WorkflowHandle[Any, Any]) -> str | None:
    """"served" once a worker ran the task (or it ended), "unregistered" if a worker lacks its agent."""
    unregistered = False
    async for ev in handle.fetch_history_events():
        if ev.event_type in _CLOSED:
            return "served"
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            message = ev.workflow_task_failed_event_attributes.failure.message
            unregistered = unregistered or "is not registered on this worker" in message
    return "unregistered" if unregistered else None


async def _has_pollers(handle: WorkflowHandle[Any, Any], queue: str) -> bool:
    client = handle._client
    req = DescribeTaskQueueRequest(namespace=client.namespace, task_queue=TaskQueue(name=queue),
                                   task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)
    resp = await client.workflow_service.describe_task_queue(req)
    return len(resp.pollers) > 0


async def unserved_reason(handle: WorkflowHandle[Any, Any], queue: str, agent: str | None, *,
                          module: str | None = None, wait_s: float = SERVED_WAIT_S) -> str | None:
    """Why no worker will run this task, or None when one does (or may: a busy worker)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + wait_s
    what = f"agent {agent!r}" if agent else "this task's agent"
    while True:
        state = await _first_task(handle)
        if state == "served":
            return None
        if state == "unregistered":
            return unregistered_message(queue, agent, module)
        if loop.time() >= end:
            break
        await asyncio.sleep(0.25)
    if not await _has_pollers(handle, queue):
        return f"no worker polls task queue {queue!r} for {what}; run {fix_hint(queue, module)}"
    return None
