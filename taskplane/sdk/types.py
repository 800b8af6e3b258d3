"""Plain data that crosses Temporal boundaries: activity inputs/outputs, the task's result
envelope, the query view and a human decision.

Dataclasses (not pydantic) so every converter Temporal ships can carry them and the
workflow sandbox needs nothing heavy to build them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    def message(self) -> dict[str, Any]:
        """The assistant message, ready to append to the conversation."""
        return {"role": "assistant", "content": self.text}

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
    attempts: int = 0
    retries: int = 0
    llm_calls: int = 0
    error: str | None = None
    parent_task_id: str | None = None


@dataclass
class TaskRowResult:
    """What was recorded, and the agent's learned step count (for steps-remaining)."""

    cost_usd: float
    learned_steps: int | None = None
    attempts: int | None = None
    retries: int | None = None


@dataclass
class AgentOutput:
    """The workflow's result: the agent's return value wrapped with what it cost."""

    result: Any
    task_id: str
    status: str
    cost_usd: float
    llm_calls: int
    attempts: int = 0


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
