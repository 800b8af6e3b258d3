"""Plain data that crosses Temporal boundaries: activity inputs/outputs, the task's result
envelope, the query view and a human decision.

Dataclasses (not pydantic) so every converter Temporal ships can carry them and the
workflow sandbox needs nothing heavy to build them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: ``arguments`` is the decoded JSON object."""

    id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str = "{}"


def parse_tool_calls(message: dict[str, Any]) -> list[ToolCall]:
    """The assistant message's tool calls with their arguments decoded (``{}`` if not JSON)."""
    out: list[ToolCall] = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function") or {}
        raw = fn.get("arguments") or "{}"
        try:
            args = json.loads(raw) if isinstance(raw, str) else dict(raw)
        except (ValueError, TypeError):
            args = {}
        out.append(ToolCall(id=str(c.get("id") or ""), name=str(fn.get("name") or ""),
                            arguments=args if isinstance(args, dict) else {"value": args},
                            raw_arguments=raw if isinstance(raw, str) else json.dumps(raw)))
    return out


@dataclass
class LlmRequest:
    """What the ``llm_call`` activity sends; the context rides in the Temporal header."""

    kind: str  # "chat" or "completion"
    body: dict[str, Any]
    timeout_s: float = 120.0


@dataclass
class LlmResponse:
    """The OpenAI response plus what the gateway said about serving it.

    ``summary`` comes first so the Temporal UI's event history shows it at the top of the
    activity's result: model, replica, GPU, tokens, cost, time.
    """

    summary: str = ""
    step: int = 0
    attempt: int = 1
    call_id: str | None = None
    model: str | None = None
    replica: str | None = None
    gpu: str | None = None
    cost_usd: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    queue_ms: float = 0.0
    http_ms: float = 0.0
    started_at_s: float = 0.0  # wall clock of the HTTP send (for the overhead benchmark)
    ended_at_s: float = 0.0
    response: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The first choice's text (chat message content or completion text)."""
        choices = self.response.get("choices") or []
        if not choices:
            return ""
        first = choices[0]
        if "message" in first:
            return str((first.get("message") or {}).get("content") or "")
        return str(first.get("text") or "")

    @property
    def raw_message(self) -> dict[str, Any]:
        """The first choice's ``message`` as the engine sent it ({} for a text completion)."""
        choices = self.response.get("choices") or []
        return dict((choices[0].get("message") or {}) if choices else {})

    @property
    def message(self) -> dict[str, Any]:
        """The assistant message, ready to append to the conversation (with its tool calls)."""
        calls = self.raw_message.get("tool_calls") or []
        if calls:
            return {"role": "assistant", "content": self.raw_message.get("content"), "tool_calls": calls}
        return {"role": "assistant", "content": self.text}

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tool calls the model asked for (run them with ``llm.run_tool_calls``)."""
        return parse_tool_calls(self.raw_message)

    @property
    def finish_reason(self) -> str | None:
        choices = self.response.get("choices") or []
        return choices[0].get("finish_reason") if choices else None

    @property
    def parsed(self) -> Any:
        """The validated structured output when the call passed ``response_format`` (else None)."""
        return self.__dict__.get("_parsed")

    @property
    def usage(self) -> dict[str, Any]:
        return dict(self.response.get("usage") or {})


@dataclass
class TaskRowInput:
    """What the workflow asks the ``task_record`` activity to upsert (one task row)."""

    task_id: str
    agent: str
    tenant: str
    priority: str
    status: str
    started_at: str
    deadline: str | None = None
    deadline_met: bool | None = None
    finished_at: str | None = None
    cost_usd: float = 0.0  # everything, sub-agents included
    child_cost_usd: float = 0.0  # the sub-agents' part of cost_usd
    attempts: int = 0  # own attempts (the sub-agents' are child_attempts)
    child_attempts: int = 0
    retries: int = 0
    llm_calls: int = 0  # own calls (the sub-agents' are child_llm_calls)
    child_llm_calls: int = 0
    error: str | None = None
    parent_task_id: str | None = None  # a sub-agent's: the task that started it
    root_task_id: str | None = None  # a sub-agent's: the goal at the top of its tree


@dataclass
class TaskRowResult:
    """What was recorded, and the agent's learned step count (for steps-remaining)."""

    cost_usd: float
    learned_steps: int | None = None
    attempts: int | None = None
    retries: int | None = None


@dataclass
class AgentOutput:
    """The workflow's result: the agent's return value wrapped with what it cost.

    ``TaskHandle.outcome()`` returns one for every finished task; for a task that did not
    succeed ``result`` is None and ``failure_type`` / ``error`` say why.
    """

    result: Any
    task_id: str
    status: str
    cost_usd: float
    llm_calls: int  # sub-agents' calls included
    attempts: int = 0
    failure_type: str | None = None  # set when the task did not succeed
    error: str | None = None


@dataclass
class Decision:
    """A human's answer to ``approval(key)``."""

    key: str
    approved: bool
    note: str = ""
    by: str = ""


@dataclass
class TaskView:
    """What the ``state`` query returns: where the task is and what it has spent."""

    task_id: str
    agent: str
    tenant: str
    priority: str
    status: str
    session_id: str
    step: int
    llm_calls: int
    cost_usd: float
    max_cost_usd: float | None
    deadline: str | None
    budget_ms_left: float | None
    current: str
    run: int
    pending_approvals: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
