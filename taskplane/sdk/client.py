"""Submitting tasks: ``await taskplane.submit(agent, *args, ...)`` and the handle it returns."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import ApplicationError, CancelledError, TerminatedError, TimeoutError
from temporalio.service import RPCError

from taskplane import temporal_names as tn
from taskplane.context import Priority
from taskplane.sdk.agent import AGENTS, Agent
from taskplane.sdk.convert import convert_value, return_hint, summarize_args
from taskplane.sdk.errors import TaskFailed
from taskplane.sdk.interceptors import START_CONTEXT, TaskplaneClientInterceptor
from taskplane.sdk.payloads import data_converter
from taskplane.sdk.resolve import resolve
from taskplane.sdk.served import unserved_reason
from taskplane.sdk.spec import execution_timeout
from taskplane.sdk.start_attributes import start_memo, start_search_attributes
from taskplane.sdk.state import TaskContext, format_time
from taskplane.sdk.types import AgentOutput, Decision, TaskView
from taskplane.sdk.unrun import record_unrun_task

_CLIENTS: dict[tuple[str, str, int], Client] = {}


async def connect(
    temporal_address: str | None = None, *, namespace: str = "default", state_dir: Path | str | None = None
) -> Client:
    """A Temporal client with taskplane's converter and context interceptor (cached per loop)."""
    address = resolve(temporal_address=temporal_address, state_dir=state_dir).temporal_address
    key = (address, namespace, id(asyncio.get_running_loop()))
    cached = _CLIENTS.get(key)
    if cached is not None:
        return cached
    try:
        client = await Client.connect(
            address, namespace=namespace, data_converter=data_converter(),
            interceptors=[TaskplaneClientInterceptor()],
        )
    except Exception as exc:
        from taskplane.errors import UserError

        raise UserError(
            f"cannot reach Temporal at {address}: {exc}; start it with `taskplane dev up` "
            "or set TASKPLANE_TEMPORAL_ADDRESS to a running server"
        ) from None
    _CLIENTS[key] = client
    return client


def taskplane_client(client: Client) -> Client:
    """The same connection with taskplane's converter and interceptor, if it lacks them."""
    config = client.config()
    if any(isinstance(i, TaskplaneClientInterceptor) for i in config["interceptors"]) and config[
        "data_converter"
    ] is data_converter():
        return client
    return Client(
        client.service_client, namespace=client.namespace, data_converter=data_converter(),
        interceptors=[TaskplaneClientInterceptor()],
    )


def _deadline(deadline: timedelta | datetime | float | None, now: datetime) -> datetime | None:
    if deadline is None:
        return None
    if isinstance(deadline, datetime):
        return deadline if deadline.tzinfo else deadline.replace(tzinfo=UTC)
    if isinstance(deadline, timedelta):
        return now + deadline
    return now + timedelta(seconds=float(deadline))


def _agent(target: Agent | str) -> Agent:
    if isinstance(target, Agent):
        return target
    found = AGENTS.get(target)
    if found is None:
        raise ValueError(f"no agent named {target!r} is defined in this process; import its module first")
    return found


async def submit(
    agent_fn: Agent | str,
    *args: Any,
    tenant: str | None = None,
    priority: str | None = None,
    deadline: timedelta | datetime | float | None = None,
    max_cost_usd: float | None = None,
    session_id: str | None = None,
    task_id: str | None = None,
    steps: int | None = None,
    client: Client | None = None,
    temporal_address: str | None = None,
    task_queue: str = tn.TASK_QUEUE,
) -> TaskHandle:
    """Start ``agent_fn(*args)`` as a durable task and return its handle at once.

    Every option defaults to what ``@agent`` said: ``deadline`` is a timedelta, seconds
    or an absolute datetime; ``session_id`` groups calls that share KV cache (default:
    the task id); ``task_id`` is the workflow id (default: ``<agent>-<random>``).
    """
    ag = _agent(agent_fn)
    spec = ag.spec
    prio = Priority(priority or spec.priority).value
    now = datetime.now(UTC)
    task_id = task_id or f"{ag.name}-{uuid.uuid4().hex[:12]}"
    deadline_dt = _deadline(deadline, now) if deadline is not None else _deadline(spec.deadline, now)
    ctx = TaskContext(
        task_id=task_id, agent=ag.name, tenant=tenant or spec.tenant or "default", priority=prio,
        session_id=session_id or task_id, deadline=format_time(deadline_dt),
        max_cost_usd=max_cost_usd if max_cost_usd is not None else spec.max_cost_usd,
        expected_steps=steps if steps is not None else spec.steps, started_at=format_time(now),
        allow_fallback=spec.allow_fallback,
    )
    tc = taskplane_client(client) if client is not None else await connect(temporal_address)
    token = START_CONTEXT.set(ctx)
    try:
        handle: WorkflowHandle[Any, AgentOutput] = await tc.start_workflow(
            ag.name, args=list(args), id=task_id, task_queue=task_queue, result_type=AgentOutput,
            memo=start_memo(ctx, args, ag.__module__), search_attributes=TypedSearchAttributes(start_search_attributes(ctx)),
            static_summary=summarize_args(ag.name, args),
            execution_timeout=execution_timeout(deadline_dt, now),
        )
    finally:
        START_CONTEXT.reset(token)
    return TaskHandle(handle, ag, task_queue=task_queue)


class TaskHandle:
    """A submitted task: wait for it, ask what it cost, steer or cancel it."""

    def __init__(self, handle: WorkflowHandle[Any, AgentOutput], ag: Agent | None = None, *,
                 task_queue: str | None = None) -> None:
        self.handle = handle
        self.agent = ag
        self.task_queue = task_queue

    @property
    def task_id(self) -> str:
        return self.handle.id

    async def outcome(self) -> AgentOutput:
        """What the finished task did: status, cost, LLM calls and attempts, for any ending.

        A task that did not succeed has ``result=None`` and its ``failure_type`` / ``error``.
        A task no worker serves fails within seconds (it is terminated, and the error names
        the agent, the task queue and the command that serves it) instead of waiting forever;
        its task row is written then (status failed, with that error) when a database is known.
        """
        result = asyncio.ensure_future(self.handle.result())
        watchdog = asyncio.ensure_future(self._watch_served())
        try:
            done, _ = await asyncio.wait({result, watchdog}, return_when=asyncio.FIRST_COMPLETED)
            if result not in done and (reason := watchdog.result()) is not None:
                try:
                    await self.handle.terminate(reason=reason)
                except RPCError:
                    pass  # it ended meanwhile (or was terminated by another caller): its own ending counts
                else:
                    await record_unrun_task(self.handle, "failed", reason)
                    return await self._failed_outcome("failed", "AgentNotServed", reason)
            return await result
        except WorkflowFailureError as exc:
            return await self._from_failure(exc)
        finally:
            for f in (result, watchdog):
                if not f.done():
                    f.cancel()

    async def _watch_served(self) -> str | None:
        """Resolves with a reason once it is clear no worker serves the task; else never."""
        queue = self.task_queue or tn.TASK_QUEUE
        name = self.agent.name if self.agent is not None else None
        reason = await unserved_reason(self.handle, queue, name, module=self.agent.__module__ if self.agent else None)
        if reason is None:
            await asyncio.Event().wait()
        return reason

    async def _from_failure(self, exc: WorkflowFailureError) -> AgentOutput:
        cause = exc.cause
        if isinstance(cause, ApplicationError):
            info = cause.details[0] if cause.details and isinstance(cause.details[0], dict) else {}
            return AgentOutput(
                result=None, task_id=self.task_id, status=str(info.get("status", "failed")),
                cost_usd=float(info.get("cost_usd") or 0.0), llm_calls=int(info.get("llm_calls") or 0),
                attempts=int(info.get("attempts") or 0), failure_type=cause.type or "failed", error=cause.message,
            )
        if isinstance(cause, CancelledError):
            return await self._failed_outcome("cancelled", "Cancelled", "cancelled")
        if isinstance(cause, TerminatedError):
            served = not cause.message.startswith(("no worker", "cancelled; no worker"))  # served.py's reasons
            if not served:  # its row, if the client that terminated it could not write it
                await record_unrun_task(self.handle, "cancelled" if cause.message.startswith("cancelled") else "failed",
                                        cause.message)
            return await self._failed_outcome("failed", "Terminated" if served else "AgentNotServed", cause.message)
        if isinstance(cause, TimeoutError):
            # the execution timeout (deadline + grace) only fires for a task no worker ran to its end
            await record_unrun_task(self.handle, "failed-deadline", f"timed out: {cause}")
            return await self._failed_outcome("failed-deadline", "WorkflowTimedOut", str(cause))
        return await self._failed_outcome("failed", type(cause).__name__, str(cause))

    async def _failed_outcome(self, status: str, failure_type: str, message: str) -> AgentOutput:
        """An outcome from the task's search attributes (the workflow left no result)."""
        sa = (await self.handle.describe()).typed_search_attributes
        return AgentOutput(
            result=None, task_id=self.task_id, status=status, cost_usd=float(sa.get(tn.COST_USD) or 0.0),
            llm_calls=int(sa.get(tn.LLM_CALLS) or 0), failure_type=failure_type, error=message,
        )

    async def result(self) -> Any:
        """The agent's return value, typed as the agent declared it; TaskFailed if it did not succeed."""
        out = await self.outcome()
        if out.status != "succeeded":
            raise TaskFailed(self.task_id, out.status, out.failure_type or "failed", out.error or "", out.cost_usd)
        hint = return_hint(self.agent.spec.fn) if self.agent is not None else None
        return convert_value(out.result, hint)

    async def cost(self) -> float:
        """Spend so far (USD): live from the running task, else its final TaskplaneCostUsd."""
        desc = await self.handle.describe()
        if desc.status == WorkflowExecutionStatus.RUNNING:
            try:
                return (await self.state()).cost_usd
            except Exception:  # no worker to answer the query: the last published value
                pass
        return float(desc.typed_search_attributes.get(tn.COST_USD) or 0.0)

    async def status(self) -> str:
        """running, waiting-approval, succeeded, failed, failed-deadline or cancelled."""
        desc = await self.handle.describe()
        return str(desc.typed_search_attributes.get(tn.STATUS) or "running")

    async def state(self) -> TaskView:
        """The task's live state and spend (the ``state`` query)."""
        return await self.handle.query("state", result_type=TaskView)

    async def approve(self, key: str, note: str = "", by: str = "") -> TaskView:
        return await self._decide(Decision(key=key, approved=True, note=note, by=by))

    async def reject(self, key: str, note: str = "", by: str = "") -> TaskView:
        return await self._decide(Decision(key=key, approved=False, note=note, by=by))

    async def _decide(self, decision: Decision) -> TaskView:
        return await self.handle.execute_update("decide", decision, result_type=TaskView)

    async def cancel(self) -> None:
        """Ask the task to stop; a task no worker runs (so none can cancel it) is terminated."""
        await self.handle.cancel()
        queue = self.task_queue or tn.TASK_QUEUE
        reason = await unserved_reason(self.handle, queue, self.agent.name if self.agent else None, wait_s=2.0)
        if reason is not None:
            await self.handle.terminate(reason=f"cancelled; {reason}")
            await record_unrun_task(self.handle, "cancelled", f"cancelled; {reason}")


def get_handle(client: Client, task_id: str, ag: Agent | None = None) -> TaskHandle:
    """A handle to an existing task by id."""
    return TaskHandle(taskplane_client(client).get_workflow_handle(task_id, result_type=AgentOutput), ag)
