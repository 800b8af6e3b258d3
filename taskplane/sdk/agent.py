"""``@agent``: an async function becomes a durable Temporal workflow (one task).

The decorator writes the workflow class the author never sees: its type name is the
agent's name, its ``run`` takes the function's own parameters (so the Temporal UI and
CLI show and accept the author's arguments), and a shared base class
(``agent_workflow.py``) gives every agent the same life cycle, handlers and failure
mapping. Awaited inside another agent, an agent runs as a sub-agent (``sub_agent.py``).

Temporal's sandbox stays on: the author's module is re-imported for each task, so an
import-time side effect or a clock/random/I-O call in the agent body is caught and
reported with what to do instead.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar, overload

from temporalio import workflow

from taskplane.context import Priority
from taskplane.sdk.agent_workflow import AgentWorkflow
from taskplane.sdk.errors import AgentError
from taskplane.sdk.spec import DEFAULT_HISTORY_LIMIT, AgentSpec
from taskplane.sdk.sub_agent import run_sub_agent

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

#: Every agent the process has defined, by name (outside the sandbox only).
AGENTS: dict[str, Agent] = {}


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
        return run_sub_agent(self.spec, args)

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
    model: str | None = None,
    adapter: str | None = None,
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
    model: str | None = None,
    adapter: str | None = None,
) -> Agent | Callable[[F], Agent]:
    """Make an async function an agent: a durable task with its own context and budget.

    ``name`` is the Temporal workflow type (default: the function name); ``tenant`` and
    ``priority`` are defaults that ``submit()`` may override; ``deadline`` is the task's
    time budget from its start; ``max_cost_usd`` stops the task once its spend crosses
    it; ``steps`` is the author's estimate of LLM calls per task (for steps-remaining);
    ``allow_fallback`` lets the gateway move calls to a fallback model; ``history_limit``
    is the history length at which ``should_continue_as_new()`` turns true. ``model`` is
    the model of ``llm.chat`` / ``llm.complete`` calls that name none, and ``adapter`` the
    LoRA adapter (served on ``model``, as vLLM names it) of the calls on ``model`` that name
    no adapter themselves.
    """
    if adapter is not None and model is None:
        raise ValueError("@agent adapter needs the base model it runs on: pass model= too")
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
            history_limit=history_limit, model=model, adapter=adapter,
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
