"""The life cycle every agent's workflow class shares.

Task row at start and end, search attributes, memo, current details; the handlers
(approve/reject a step, query state and spend); the deadline racing the body; and the
failure mapping (succeeded / failed / failed-deadline / cancelled). ``agent.py`` writes
one subclass per agent whose ``run`` takes the agent function's own parameters.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, ClassVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from taskplane import temporal_names as tn
from taskplane.sdk import retry
from taskplane.sdk.errors import AgentError, DeadlineExceeded, NotDeterministic
from taskplane.sdk.runtime import TaskRuntime
from taskplane.sdk.spec import AgentSpec
from taskplane.sdk.start_attributes import start_memo, start_search_attributes
from taskplane.sdk.state import TaskContext, format_time, parse_time
from taskplane.sdk.types import AgentOutput, Decision, TaskRowInput, TaskRowResult, TaskView


class AgentWorkflow:
    """The life cycle shared by every agent's workflow class."""

    _tp_spec: ClassVar[AgentSpec]

    def __init__(self) -> None:
        self._tp: TaskRuntime | None = None
        self._tp_header: TaskContext | None = None  # set by the inbound interceptor

    # --- handlers ---------------------------------------------------------------------

    @workflow.signal(name="decision")
    def _tp_signal_decision(self, decision: Decision) -> None:
        """Approve or reject a step waiting in ``approval(key)`` (fire and forget)."""
        if self._tp is not None:
            self._tp.decisions[decision.key] = decision

    @workflow.update(name="decide")
    def _tp_update_decide(self, decision: Decision) -> TaskView:
        """Approve or reject a step; returns the task's state after the decision."""
        assert self._tp is not None
        self._tp.decisions[decision.key] = decision
        return self._tp.view()

    @_tp_update_decide.validator
    def _tp_validate_decide(self, decision: Decision) -> None:
        if self._tp is None:
            raise ValueError("the task has not started yet")
        if self._tp.status not in ("running", "waiting-approval"):
            raise ValueError(f"the task is {self._tp.status}; there is nothing to decide")
        if not decision.key:
            raise ValueError("a decision needs the key of the approval it answers")

    @workflow.query(name="state")
    def _tp_query_state(self) -> TaskView:
        """Where the task is and what it has spent."""
        if self._tp is None:
            info = workflow.info()
            return TaskView(
                task_id=info.workflow_id, agent=info.workflow_type, tenant="", priority="",
                status="starting", session_id=info.workflow_id, step=0, llm_calls=0, cost_usd=0.0,
                max_cost_usd=None, deadline=None, budget_ms_left=None, current="starting", run=0,
            )
        return self._tp.view()

    # --- life cycle -------------------------------------------------------------------

    async def _tp_run(self, args: tuple[Any, ...]) -> AgentOutput:
        spec = type(self)._tp_spec
        rt = TaskRuntime(spec=spec, ctx=self._tp_initial_context())
        self._tp = rt
        first_run = rt.ctx.run == 0
        if first_run:
            self._tp_announce(args)
            row = await self._tp_record(rt, "running")
            if row is not None:
                rt.ctx.learned_steps = row.learned_steps
        rt.publish(status="running")
        rt.set_current("running")

        status, failure_type, message = "succeeded", "", ""
        cancelled: BaseException | None = None
        value: Any = None
        try:
            value = await self._tp_body(rt, args)
        except asyncio.CancelledError as exc:
            status, failure_type, message, cancelled = "cancelled", "Cancelled", "cancelled", exc
        except Exception as exc:  # the agent's own failure ends the task; never a stuck workflow task
            status, failure_type, message = self._tp_classify(rt, exc)

        recorded = await self._tp_record(rt, status, error=message or None)
        if recorded is not None:
            # the gateway's rows are the truth: full precision, failed attempts included
            rt.ctx.sunk_cost_usd = recorded.cost_usd
        rt.publish(status=status)
        rt.set_current(f"{status}" + (f": {message}" if message else ""))
        if cancelled is not None:
            raise cancelled
        if status != "succeeded":
            raise ApplicationError(
                f"{message} (spent ${rt.ctx.sunk_cost_usd:.6f})",
                # the message without the spend suffix, for a parent that words its own failure
                {"status": status, "cost_usd": rt.ctx.sunk_cost_usd, "llm_calls": rt.total_calls,
                 "attempts": rt.total_attempts, "message": message},
                type=failure_type,
                non_retryable=True,
            )
        return AgentOutput(
            result=value, task_id=rt.ctx.task_id, status=status, cost_usd=rt.ctx.sunk_cost_usd,
            llm_calls=rt.total_calls, attempts=rt.total_attempts,
        )

    async def _tp_body(self, rt: TaskRuntime, args: tuple[Any, ...]) -> Any:
        """The author's function, ended at the deadline whatever it is awaiting.

        A durable timer races the body: at the deadline the body is cancelled (its
        activities and sub-agents with it) and the task ends failed-deadline then, not
        when the body next happens to call the SDK.
        """
        fn = type(self)._tp_spec.fn
        budget = rt.budget_ms()
        if budget is None:
            return await fn(*args)
        try:
            return await asyncio.wait_for(fn(*args), timeout=max(budget, 1.0) / 1000.0)
        except TimeoutError:
            raise DeadlineExceeded(
                f"task {rt.ctx.task_id} reached its deadline {rt.ctx.deadline} during: {rt.current}"
            ) from None

    def _tp_initial_context(self) -> TaskContext:
        """The header's context (client, parent or previous run), else the agent's defaults."""
        spec = type(self)._tp_spec
        info = workflow.info()
        ctx = self._tp_header or TaskContext(task_id=info.workflow_id, agent=spec.name)
        ctx.task_id = info.workflow_id
        ctx.agent = spec.name
        ctx.session_id = ctx.session_id or info.workflow_id
        if self._tp_header is None:
            ctx.tenant = spec.tenant or "default"
            ctx.priority = spec.priority
            ctx.max_cost_usd = spec.max_cost_usd
            ctx.allow_fallback = spec.allow_fallback
            if spec.deadline is not None:
                ctx.deadline = format_time(info.start_time + spec.deadline)
        if ctx.expected_steps is None:
            ctx.expected_steps = spec.steps
        if ctx.started_at is None:
            ctx.started_at = format_time(workflow.now())
        return ctx

    def _tp_announce(self, args: tuple[Any, ...]) -> None:
        """Memo and search attributes, unless whoever started the task already set them."""
        rt = self._tp
        assert rt is not None
        if workflow.memo_value("inputs", None) is None:
            workflow.upsert_memo(start_memo(rt.ctx, args))
        if workflow.info().typed_search_attributes.get(tn.AGENT) is None:
            workflow.upsert_search_attributes([p.key.value_set(p.value) for p in start_search_attributes(rt.ctx)])
        rt.status = "running"
        rt.reported_cost, rt.reported_calls = 0.0, 0

    def _tp_classify(self, rt: TaskRuntime, exc: Exception) -> tuple[str, str, str]:
        """Map an exception that escaped the agent to (status, failure type, message)."""
        if type(exc).__name__ == "RestrictedWorkflowAccessError":
            what = str(exc).split(". If this is code", 1)[0].rstrip(".")
            exc = NotDeterministic(
                f"agent {rt.spec.name!r} did something only a @step may do ({what}). An agent body is "
                "replayed deterministically: move I/O, clocks, randomness and network calls into a "
                "@step function (a tool), use `await asyncio.sleep()` for waiting and pass values in "
                "as arguments; module-level code must not do I/O at import either"
            )
        if isinstance(exc, AgentError):
            failure_type, message = exc.failure_type, str(exc)
        elif isinstance(exc, ApplicationError):
            failure_type, message = exc.type or "ApplicationError", exc.message
        else:
            failure_type, message = type(exc).__name__, str(exc) or type(exc).__name__
        out_of_time = isinstance(exc, DeadlineExceeded) or (
            (budget := rt.budget_ms()) is not None and budget <= 0
        )
        return ("failed-deadline" if out_of_time else "failed"), failure_type, message

    async def _tp_record(self, rt: TaskRuntime, status: str, error: str | None = None) -> TaskRowResult | None:
        """Upsert the task row through an activity; bookkeeping never fails the task."""
        ctx = rt.ctx
        finished = status != "running"
        now = workflow.now()
        deadline = parse_time(ctx.deadline)
        deadline_met: bool | None = None
        if finished:
            deadline_met = status == "succeeded" and (deadline is None or now <= deadline)
        row = TaskRowInput(
            task_id=ctx.task_id, agent=ctx.agent, tenant=ctx.tenant, priority=ctx.priority,
            status=status, started_at=ctx.started_at or format_time(now) or "", deadline=ctx.deadline,
            deadline_met=deadline_met, finished_at=format_time(now) if finished else None,
            cost_usd=ctx.sunk_cost_usd, child_cost_usd=ctx.child_cost_usd, attempts=ctx.attempts,
            child_attempts=ctx.child_attempts, llm_calls=ctx.llm_calls, child_llm_calls=ctx.child_llm_calls,
            retries=max(ctx.attempts - ctx.llm_calls, 0), error=error, parent_task_id=ctx.parent_task_id,
            root_task_id=ctx.root_task_id,
        )
        rt.pending_header = ctx.copy()
        try:
            return await workflow.execute_activity(
                "task_record", row, result_type=TaskRowResult,
                start_to_close_timeout=timedelta(seconds=10),
                schedule_to_close_timeout=timedelta(seconds=60),
                retry_policy=retry.RECORD_RETRY_POLICY,
                summary=f"task row: {status}",
            )
        except ActivityError as exc:
            workflow.logger.warning("task row for %s not recorded: %s", ctx.task_id, exc.cause or exc)
            return None
