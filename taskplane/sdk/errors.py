"""Exceptions an agent author sees, and the failure types a task ends with.

Inside an agent these are ordinary Python exceptions the author may catch; when one
escapes the agent the task ends and the exception's ``failure_type`` becomes the
Temporal failure type, so the Temporal UI, the task row and ``TaskHandle.result()``
all name the same reason.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.exceptions import is_cancelled_exception


class AgentError(Exception):
    """Base of the SDK's exceptions."""

    failure_type = "AgentError"


class LlmError(AgentError):
    """An LLM call failed for good: a non-retryable gateway error, or retries ran out."""

    failure_type = "LlmError"

    def __init__(self, error_type: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message
        self.retryable = retryable


class StepFailed(AgentError):
    """A ``@step`` (tool) failed for good after its retries."""

    failure_type = "StepFailed"

    def __init__(self, step: str, error_type: str, message: str) -> None:
        super().__init__(f"step {step!r} failed ({error_type}): {message}")
        self.step = step
        self.error_type = error_type
        self.message = message


class DeadlineExceeded(AgentError):
    """The task's deadline budget ran out (or the gateway says it cannot be met)."""

    failure_type = "DeadlineExceeded"


class BudgetExceeded(AgentError):
    """The task's spend crossed its ``max_cost_usd``."""

    failure_type = "BudgetExceeded"

    def __init__(self, spent_usd: float, max_cost_usd: float) -> None:
        super().__init__(
            f"cost budget exceeded: spent ${spent_usd:.6f} of max_cost_usd=${max_cost_usd:.6f}; "
            "raise max_cost_usd on the agent or in submit(), or make fewer/cheaper calls"
        )
        self.spent_usd = spent_usd
        self.max_cost_usd = max_cost_usd


class SubAgentFailed(AgentError):
    """A sub-agent (child task) ended without success."""

    failure_type = "SubAgentFailed"

    def __init__(self, task_id: str, status: str, message: str, cost_usd: float) -> None:
        super().__init__(f"sub-agent {task_id} {status}: {message}")
        self.task_id = task_id
        self.status = status
        self.message = message
        self.cost_usd = cost_usd


class NotDeterministic(AgentError):
    """The agent body did something only a ``@step`` may do (I/O, clocks, randomness)."""

    failure_type = "AgentNotDeterministic"


class AgentNotServed(AgentError):
    """No worker on the task's queue registers its agent: the task fails with the fix."""

    failure_type = "AgentNotServed"


class TaskFailed(Exception):
    """Raised by ``TaskHandle.result()`` when the task did not succeed."""

    def __init__(self, task_id: str, status: str, failure_type: str, message: str, cost_usd: float | None) -> None:
        super().__init__(f"task {task_id} {status} ({failure_type}): {message}")
        self.task_id = task_id
        self.status = status
        self.failure_type = failure_type
        self.message = message
        self.cost_usd = cost_usd


class StructuredOutputError(LlmError):
    """The model's reply did not parse as, or validate against, the requested ``response_format``.

    ``raw`` is the text the model sent, ``errors`` what did not validate; catch it to
    retry the call, or to repair the output yourself.
    """

    failure_type = "StructuredOutputError"

    def __init__(self, message: str, *, raw: str, errors: list[Any] | None = None) -> None:
        super().__init__("invalid_output", message)
        self.raw = raw
        self.errors = errors or []


def raise_if_cancelled(exc: BaseException) -> None:
    """Raise a cancellation the task itself asked for as the cancellation it is.

    At the deadline (or on a cancel request) the agent body's task is cancelled; the step,
    LLM call or sub-agent it was awaiting then resolves as an error whose cause is
    Temporal's CancelledError. Reported as that call's own failure it would hide the reason
    the task ended (StepFailed instead of DeadlineExceeded, failed instead of cancelled).
    """
    task = asyncio.current_task()
    if is_cancelled_exception(exc) and task is not None and task.cancelling():
        raise asyncio.CancelledError() from exc
