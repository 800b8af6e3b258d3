"""``@step``: a function becomes an activity (a tool) with its own retries and timeout.

Awaited inside an agent, a step runs once per task even across worker crashes (its
result is in the history); anything non-deterministic - I/O, clocks, randomness,
network - belongs here. Called outside an agent it is the plain function, so tools stay
unit-testable.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar, overload

from temporalio import activity, workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    RetryState,
    TimeoutError,
    TimeoutType,
)

from taskplane.sdk import retry
from taskplane.sdk.convert import return_hint, summarize_args
from taskplane.sdk.errors import DeadlineExceeded, StepFailed, raise_if_cancelled
from taskplane.sdk.runtime import runtime

F = TypeVar("F", bound=Callable[..., Any])

#: Every step the process has defined, by activity name (outside the sandbox only).
STEPS: dict[str, Step] = {}
#: Names that more than one function took (each definition, first first): activities are
#: registered by name, so a worker refuses to serve them (``clashing_steps``).
CLASHES: dict[str, list[Step]] = {}

DEFAULT_TIMEOUT = timedelta(minutes=5)


class Step:
    """A tool: an activity when awaited inside an agent, the plain function elsewhere."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        retries: int,
        timeout: timedelta,
        non_retryable: Sequence[type[BaseException] | str],
        heartbeat: timedelta | None,
    ) -> None:
        self.fn = fn
        self.name = name
        self.retries = retries
        self.timeout = timeout
        self.heartbeat = heartbeat
        self.non_retryable = [t if isinstance(t, str) else t.__name__ for t in non_retryable]
        self.activity = activity.defn(name=name)(_as_async_activity(fn))
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any) -> Any:
        if workflow.in_workflow():
            return _run_step(self, args)
        return self.fn(*args)

    def __repr__(self) -> str:
        return f"<taskplane step {self.name!r}>"


def _as_async_activity(fn: Callable[..., Any]) -> Callable[..., Any]:
    """An async activity with the function's signature; sync tools run in a thread."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any) -> Any:
            return await fn(*args)

        return run_async

    @functools.wraps(fn)
    async def run_in_thread(*args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    return run_in_thread


@overload
def step(fn: F, /) -> Step: ...


@overload
def step(
    *,
    name: str | None = None,
    retries: int = 3,
    timeout: timedelta = DEFAULT_TIMEOUT,
    non_retryable: Sequence[type[BaseException] | str] = (),
    heartbeat: timedelta | None = None,
) -> Callable[[F], Step]: ...


def step(
    fn: F | None = None,
    /,
    *,
    name: str | None = None,
    retries: int = 3,
    timeout: timedelta = DEFAULT_TIMEOUT,
    non_retryable: Sequence[type[BaseException] | str] = (),
    heartbeat: timedelta | None = None,
) -> Step | Callable[[F], Step]:
    """Make a function a tool step: ``retries`` retries after the first attempt, ``timeout``
    per attempt, exceptions of the ``non_retryable`` types (classes or class names) fail at
    once. The activity name is ``name`` or the function's name."""
    if retries < 0:
        raise ValueError("@step retries must be >= 0")

    def wrap(f: F) -> Step:
        s = Step(f, name or f.__name__, retries, timeout, non_retryable, heartbeat)
        if not workflow.unsafe.in_sandbox():
            _register(s)
        return s

    return wrap(fn) if fn is not None else wrap


def origin(s: Step) -> str:
    """Where a step is defined: ``module.qualname``."""
    return f"{s.fn.__module__}.{s.fn.__qualname__}"


def _register(s: Step) -> None:
    """Remember the step by name; a second function under a taken name is a clash (the same
    function defined again, as a module reload does, replaces the first)."""
    seen = STEPS.get(s.name)
    if seen is not None and origin(seen) != origin(s):
        defs = CLASHES.setdefault(s.name, [seen])
        defs[:] = [d for d in defs if origin(d) != origin(s)] + [s]
    STEPS[s.name] = s


def clashing_steps(reserved: Sequence[str] = ()) -> list[str]:
    """One line per activity name taken twice: by two @step functions, or by a step and one
    of the worker's own activities (``reserved``). Empty when every name is unique."""
    lines = [f"{name!r} ({' and '.join(origin(d) for d in defs)})" for name, defs in sorted(CLASHES.items())]
    lines += [f"{name!r} ({origin(STEPS[name])} and taskplane's built-in activity)"
              for name in sorted(set(reserved) & set(STEPS))]
    return lines


async def _run_step(s: Step, args: tuple[Any, ...]) -> Any:
    rt = runtime(f"step {s.name!r}")
    budget_s = rt.budget_left()
    rt.set_current(f"tool {s.name}")
    rt.pending_header = rt.tool_context()
    rt.ctx.tool = s.name  # the session is in a tool now: the next LLM call says which (X-Taskplane-Tool)
    try:
        result = await workflow.execute_activity(
            s.name,
            args=list(args),
            result_type=return_hint(s.fn),
            start_to_close_timeout=s.timeout,
            schedule_to_close_timeout=None if budget_s is None else timedelta(seconds=budget_s),
            heartbeat_timeout=s.heartbeat,
            retry_policy=retry.step_retry_policy(s.retries, s.non_retryable),
            summary=summarize_args(s.name, args),
        )
    except ActivityError as exc:
        raise_if_cancelled(exc)
        cause = exc.cause
        out_of_budget = budget_s is not None and exc.retry_state == RetryState.TIMEOUT
        if out_of_budget or (isinstance(cause, TimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_CLOSE):
            raise DeadlineExceeded(f"tool {s.name!r} did not finish before the task's deadline") from None
        if isinstance(cause, ApplicationError):
            raise StepFailed(s.name, cause.type or "error", cause.message) from None
        raise StepFailed(s.name, type(cause).__name__ if cause else "error", str(cause or exc)) from None
    rt.set_current(f"tool {s.name} done")
    return result
