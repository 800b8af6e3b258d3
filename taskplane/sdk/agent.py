"""``@agent``: an async function becomes a durable Temporal workflow (one task).

The decorator writes the workflow class the author never sees: its type name is the
agent's name, its ``run`` takes the function's own parameters (so the Temporal UI and
CLI show and accept the author's arguments), and a shared base class gives every agent
the same life cycle (task row at start and end, search attributes, memo, current
details), the same handlers (approve/reject a step, query state and spend) and the
same failure mapping (succeeded / failed / failed-deadline / cancelled).

Temporal's sandbox stays on: the author's module is re-imported for each task, so an
import-time side effect or a clock/random/I-O call in the agent body is caught and
reported with what to do instead.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, ClassVar, TypeVar, overload

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

from taskplane import temporal_names as tn
from taskplane.context import Priority
from taskplane.sdk import retry
from taskplane.sdk.convert import convert_value, return_hint, summarize_args
from taskplane.sdk.errors import (
    AgentError,
    DeadlineExceeded,
    NotDeterministic,
    SubAgentFailed,
)
from taskplane.sdk.runtime import TaskRuntime, runtime
from taskplane.sdk.spec import DEFAULT_HISTORY_LIMIT, AgentSpec, execution_timeout
from taskplane.sdk.state import TaskContext, format_time, parse_time
from taskplane.sdk.types import AgentOutput, Decision, TaskRowInput, TaskRowResult, TaskView

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

#: Every agent the process has defined, by name (outside the sandbox only).
AGENTS: dict[str, Agent] = {}

#: The memo key naming the agent's module, so a worker that lacks the agent can say what to import.
MODULE_MEMO = "module"

class Agent:
    """An agent: submit it as a task, or ``await`` it inside another agent as a sub-agent."""

    def __init__(self, spec: AgentSpec, workflow_cls: type) -> None:
        self.spec = spec
        self.workflow_cls = workflow_cls
        self.__doc__ = spec.fn.__doc__
        self.__name__ = spec.fn.__name__
        self.__module__ = spec.fn.__module__
        self.__wrapped__ = spec.fn

    @property
    def name(self) -> str:
        return self.spec.name

    def __call__(self, *args: Any) -> Awaitable[Any]:
        """Inside an agent: run as a sub-agent (a child task). Elsewhere: use submit()."""
        if not workflow.in_workflow():
            raise AgentError(
                f"agent {self.name!r} is a durable task, not a plain coroutine: start it with "
                f"`await taskplane.submit({self.__name__}, ...)` or `taskplane run {self.__module__}:{self.__name__}`"
            )
        return _run_child(self, args)

    def __repr__(self) -> str:
        return f"<taskplane agent {self.name!r} ({self.__module__}.{self.__name__})>"


@overload
def agent(fn: F, /) -> Agent: ...


@overload
def agent(
    *,
    name: str | None = None,
    tenant: str | None = None,
    priority: str = "standard",
    deadline: timedelta | None = None,
    max_cost_usd: float | None = None,
    steps: int | None = None,
    allow_fallback: bool = False,
    history_limit: int = DEFAULT_HISTORY_LIMIT,
) -> Callable[[F], Agent]: ...


def agent(
    fn: F | None = None,
    /,
    *,
    name: str | None = None,
    tenant: str | None = None,
    priority: str = "standard",
    deadline: timedelta | None = None,
    max_cost_usd: float | None = None,
    steps: int | None = None,
    allow_fallback: bool = False,
    history_limit: int = DEFAULT_HISTORY_LIMIT,
) -> Agent | Callable[[F], Agent]:
    """Make an async function an agent: a durable task with its own context and budget.

    ``name`` is the Temporal workflow type (default: the function name); ``tenant`` and
    ``priority`` are defaults that ``submit()`` may override; ``deadline`` is the task's
    time budget from its start; ``max_cost_usd`` stops the task once its spend crosses
    it; ``steps`` is the author's estimate of LLM calls per task (for steps-remaining);
    ``allow_fallback`` lets the gateway move calls to a fallback model; ``history_limit``
    is the history length at which ``should_continue_as_new()`` turns true.
    """
    try:
        prio = Priority(priority).value
    except ValueError:
        raise ValueError(f"@agent priority {priority!r} is not one of critical, interactive, standard, batch") from None

    def wrap(f: F) -> Agent:
        if not asyncio.iscoroutinefunction(f):
            raise TypeError(f"@agent needs an `async def` function; {f.__qualname__} is not async")
        if "<locals>" in f.__qualname__:
            raise TypeError(
                f"@agent {f.__qualname__}: agents must be defined at module level so a worker can import them"
            )
        spec = AgentSpec(
            name=name or f.__name__, fn=f, tenant=tenant, priority=prio, deadline=deadline,
            max_cost_usd=max_cost_usd, steps=steps, allow_fallback=allow_fallback,
            history_limit=history_limit,
        )
        ag = Agent(spec, _make_workflow_class(spec))
        if not workflow.unsafe.in_sandbox():
            AGENTS[spec.name] = ag
        return ag

    return wrap(fn) if fn is not None else wrap


async def _run_template(self, *args):  # type: ignore[no-untyped-def]
    return await self._tp_run(args)


def _make_workflow_class(spec: AgentSpec) -> type:
    """Build ``@workflow.defn class <Name>: @workflow.run async def run(self, <fn params>)``.

    The class is placed in the author's module namespace under a private name because
    the sandbox re-imports that module and looks the class up there by name.
    """
    fn = spec.fn
    cls_name = f"_TaskplaneAgent_{fn.__name__}"
    run = types.FunctionType(_run_template.__code__, fn.__globals__, "run")
    run.__qualname__ = f"{cls_name}.run"
    run.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    run.__doc__ = fn.__doc__
    # inspect.signature and typing.get_type_hints follow __wrapped__: Temporal then decodes
    # the workflow's arguments with the author's own parameter types.
    run.__wrapped__ = fn  # type: ignore[attr-defined]
    workflow.run(run)
    cls = type(cls_name, (AgentWorkflow,), {"run": run, "__module__": fn.__module__, "__qualname__": cls_name})
    cls._tp_spec = spec  # type: ignore[attr-defined]
    cls = workflow.defn(name=spec.name)(cls)
    fn.__globals__[cls_name] = cls
    return cls


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


def start_memo(ctx: TaskContext, args: tuple[Any, ...] | list[Any], module: str | None = None) -> dict[str, Any]:
    """The memo a person sees first in the Temporal UI: what the task was asked (and the
    agent's ``module``, which a worker that does not serve the agent names in its error)."""
    memo: dict[str, Any] = {
        "inputs": summarize_args(ctx.agent, args),
        "tenant": ctx.tenant,
        "priority": ctx.priority,
        "session_id": ctx.session_id or ctx.task_id,
    }
    if module:
        memo[MODULE_MEMO] = module
    if ctx.deadline:
        memo["deadline"] = ctx.deadline
    if ctx.max_cost_usd is not None:
        memo["max_cost_usd"] = ctx.max_cost_usd
    if ctx.parent_task_id:
        memo["parent_task_id"] = ctx.parent_task_id
    return memo


def start_search_attributes(ctx: TaskContext) -> list[SearchAttributePair[Any]]:
    """The search-attribute values a task starts with (DESIGN.md's Temporal names)."""
    values: list[SearchAttributePair[Any]] = [
        SearchAttributePair(tn.AGENT, ctx.agent),
        SearchAttributePair(tn.STATUS, "running"),
        SearchAttributePair(tn.COST_USD, 0.0),
        SearchAttributePair(tn.LLM_CALLS, 0),
    ]
    if not ctx.parent_task_id:
        # a sub-agent is part of its parent's task, not one of the tenant's tasks: a filter
        # on TaskplaneTenant lists goals (find sub-agents by TaskplaneAgent)
        values.insert(0, SearchAttributePair(tn.TENANT, ctx.tenant))
    deadline = parse_time(ctx.deadline)
    if deadline is not None:
        values.append(SearchAttributePair(tn.DEADLINE, deadline))
    return values


async def _run_child(ag: Agent, args: tuple[Any, ...]) -> Any:
    """A sub-agent: its own task and session; the parent's tenant, priority and budgets."""
    rt = runtime(f"sub-agent {ag.name!r}")
    rt.budget_left()
    rt.check_cost()
    parent = rt.ctx
    n = parent.children
    parent.children = n + 1
    child_id = f"{parent.task_id}.{ag.name}-{n}"
    now = rt.now()
    deadlines = [d for d in (parse_time(parent.deadline), now + ag.spec.deadline if ag.spec.deadline else None) if d]
    limits = [
        x for x in (
            None if parent.max_cost_usd is None else max(parent.max_cost_usd - parent.sunk_cost_usd, 0.0),
            ag.spec.max_cost_usd,
        ) if x is not None
    ]
    child_ctx = TaskContext(
        task_id=child_id, agent=ag.name, tenant=parent.tenant, priority=parent.priority,
        session_id=child_id, deadline=format_time(min(deadlines)) if deadlines else None,
        max_cost_usd=min(limits) if limits else None, expected_steps=ag.spec.steps,
        inherited_cost_usd=parent.total_sunk_usd, started_at=format_time(now),
        parent_task_id=parent.task_id, root_task_id=parent.root_task_id or parent.task_id,
        allow_fallback=ag.spec.allow_fallback or parent.allow_fallback,
    )
    rt.pending_header = child_ctx
    rt.set_current(f"sub-agent {ag.name} ({child_id})")
    try:
        out = await workflow.execute_child_workflow(
            ag.name, args=list(args), id=child_id, task_queue=workflow.info().task_queue,
            result_type=AgentOutput, memo=start_memo(child_ctx, args, ag.__module__),
            search_attributes=TypedSearchAttributes(start_search_attributes(child_ctx)),
            static_summary=f"sub-agent {ag.name} of {parent.task_id}",
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
        message = str(info.get("message") or (cause.message if isinstance(cause, ApplicationError) else cause or exc))
        if status == "failed-deadline":
            # the child's own message already names it ("task <child_id> ran out of its deadline budget ...")
            raise DeadlineExceeded(message if child_id in message else f"sub-agent {child_id}: {message}") from None
        raise SubAgentFailed(child_id, status, message, cost) from None
    rt.add_child(out.cost_usd, out.llm_calls, out.attempts)
    rt.publish()
    rt.set_current(f"sub-agent {ag.name} done")
    rt.check_cost()
    return convert_value(out.result, return_hint(ag.spec.fn))
