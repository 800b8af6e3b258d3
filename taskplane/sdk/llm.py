"""``llm.chat`` / ``llm.complete``: an LLM call inside an agent is the ``llm_call`` activity.

The agent awaits what looks like an OpenAI call; underneath, the call claims the next
step index, becomes one Temporal activity (retried by the one policy of
:mod:`taskplane.sdk.retry`, bounded by the task's deadline budget) and carries the
task's context in a Temporal header to the activity, which sends it to the gateway.
The result is the OpenAI response plus what the gateway reported (replica, GPU, cached
tokens, cost), and the cost is added to the task's spend at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    RetryState,
    TimeoutError,
    TimeoutType,
)

from taskplane.sdk import retry
from taskplane.sdk.errors import DeadlineExceeded, LlmError, raise_if_cancelled
from taskplane.sdk.runtime import TaskRuntime, runtime
from taskplane.sdk.structured import Format, parse_output, request_format
from taskplane.sdk.tools import Tool, run_tool_calls, tool_choice_value, tool_schema
from taskplane.sdk.types import LlmRequest, LlmResponse

__all__ = ["LlmResponse", "chat", "complete", "run_tool_calls"]

ACTIVITY_NAME = "llm_call"
DEFAULT_TIMEOUT = timedelta(minutes=2)
#: A call slower than 3 s heartbeats (workflows/activities.py); a worker that dies mid-call
#: is noticed after this long and the call is retried, instead of after its whole timeout.
HEARTBEAT_TIMEOUT = timedelta(seconds=10)


async def chat(
    *,
    model: str | None = None,
    messages: list[dict[str, Any]],
    steps_remaining: int | None = None,
    allow_fallback: bool | None = None,
    timeout: timedelta | None = None,
    tools: Sequence[Tool] | None = None,
    tool_choice: Any = None,
    response_format: Format | None = None,
    adapter: str | None = None,
    **params: Any,
) -> LlmResponse:
    """An OpenAI chat completion through the gateway, as one durable step of the task.

    ``params`` are OpenAI request fields (``max_tokens``, ``temperature``...).
    ``tools`` are @step functions (schema from signature and docstring) or OpenAI tool
    dicts; ``tool_choice`` is ``"auto"``, ``"none"``, ``"required"`` or one tool (a step
    or its name); the reply's ``tool_calls`` run with :func:`run_tool_calls`.
    ``response_format`` is a pydantic model class or a JSON schema: ``response.parsed`` is
    the validated value, and a reply that does not validate raises
    :class:`~taskplane.sdk.errors.StructuredOutputError`.
    ``steps_remaining`` overrides the task's estimate for this call; ``timeout`` bounds
    one attempt (the task's deadline bounds all of them).
    ``model`` defaults to the agent's (``@agent(model=...)``); ``adapter`` names a LoRA
    adapter served on it (or say ``model="base:adapter"``), defaulting to the agent's.
    """
    model = gateway_model(model, adapter)
    body: dict[str, Any] = {"model": model, "messages": messages, **params}
    if tools:
        body["tools"] = [tool_schema(t) for t in tools]
    if tool_choice is not None:
        body["tool_choice"] = tool_choice_value(tool_choice)
    if response_format is not None:
        body["response_format"] = request_format(response_format)
    summary = f"{model} · {len(messages)} messages" + (f" · {len(tools)} tools" if tools else "")
    result = await _call("chat", body, summary, steps_remaining, allow_fallback, timeout)
    if response_format is not None and not result.tool_calls:
        result.__dict__["_parsed"] = parse_output(result.text, response_format, result.finish_reason)
    return result


async def complete(
    *,
    model: str | None = None,
    prompt: str,
    steps_remaining: int | None = None,
    allow_fallback: bool | None = None,
    timeout: timedelta | None = None,
    adapter: str | None = None,
    **params: Any,
) -> LlmResponse:
    """An OpenAI text completion through the gateway, as one durable step of the task
    (``model`` and ``adapter`` as for :func:`chat`)."""
    model = gateway_model(model, adapter)
    body: dict[str, Any] = {"model": model, "prompt": prompt, **params}
    summary = f"{model} · prompt {len(prompt)} chars"
    return await _call("completion", body, summary, steps_remaining, allow_fallback, timeout)


def gateway_model(model: str | None, adapter: str | None) -> str:
    """The body's ``model`` for a call: ``base:adapter`` when it runs with a LoRA adapter (its
    own, else the agent's for calls on the agent's model), else the model unchanged."""
    spec = runtime("llm.chat / llm.complete").spec
    base = model or spec.model
    if base is None:
        raise LlmError("invalid_request", "llm call names no model, and its @agent has no model= default")
    if adapter is None and base == spec.model:
        adapter = spec.adapter
    return with_adapter(base, adapter)


def with_adapter(model: str, adapter: str | None) -> str:
    """``model:adapter``, the model string that names a LoRA adapter on ``model`` (the
    gateway parses it; the replica is asked for the adapter by its name, as vLLM serves it)."""
    if adapter is None or model.endswith(f":{adapter}"):
        return model
    return f"{model}:{adapter}"


async def _call(
    kind: str,
    body: dict[str, Any],
    summary: str,
    steps_remaining: int | None,
    allow_fallback: bool | None,
    timeout: timedelta | None,
) -> LlmResponse:
    if body.get("stream"):
        raise LlmError("invalid_request", "streaming is not supported inside an agent; drop stream=True")
    rt = runtime("llm.chat / llm.complete")
    budget_s = rt.budget_left()
    rt.check_cost()
    ctx = rt.next_llm_context(steps_remaining=steps_remaining, allow_fallback=allow_fallback)
    attempt_timeout = timeout or DEFAULT_TIMEOUT
    if budget_s is not None:
        attempt_timeout = min(attempt_timeout, timedelta(seconds=budget_s))
    rt.set_current(f"LLM step {ctx.step}: {summary}")
    rt.pending_header = ctx
    try:
        result: LlmResponse = await workflow.execute_activity(
            ACTIVITY_NAME,
            LlmRequest(kind=kind, body=body, timeout_s=attempt_timeout.total_seconds()),
            result_type=LlmResponse,
            start_to_close_timeout=attempt_timeout + timedelta(seconds=5),
            schedule_to_close_timeout=None if budget_s is None else timedelta(seconds=budget_s),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=retry.LLM_RETRY_POLICY,
            summary=f"LLM step {ctx.step} · {summary}",
        )
    except ActivityError as exc:
        raise_if_cancelled(exc)
        raise _llm_failure(rt, ctx.step, exc) from None
    rt.add_call(result.cost_usd, result.attempt)
    rt.publish()
    rt.set_current(f"LLM step {ctx.step} done: {result.summary}")
    rt.check_cost()
    return result


def _llm_failure(rt: TaskRuntime, step: int, exc: ActivityError) -> Exception:
    """The author-facing exception for an LLM call that failed for good."""
    cause = exc.cause
    if exc.retry_state == RetryState.TIMEOUT and rt.ctx.deadline is not None:
        # the retries stopped because the next one would not fit the deadline budget
        return DeadlineExceeded(f"LLM step {step} could not succeed before the task's deadline: {cause or exc}")
    if isinstance(cause, ApplicationError):
        if cause.type in retry.DEADLINE_TYPES:
            return DeadlineExceeded(f"LLM step {step}: {cause.message}")
        return LlmError(cause.type or "error", cause.message, retryable=not cause.non_retryable)
    if isinstance(cause, TimeoutError):
        budget = rt.budget_ms()
        # schedule-to-close is only ever the deadline budget, so that timeout means "out of time".
        if cause.type == TimeoutType.SCHEDULE_TO_CLOSE or (budget is not None and budget <= 1000):
            return DeadlineExceeded(
                f"LLM step {step} did not finish before the task's deadline ({rt.ctx.deadline})"
            )
        return LlmError("timeout", f"LLM step {step} timed out ({cause.type})", retryable=True)
    return LlmError("error", f"LLM step {step} failed: {cause or exc}")
