"""The task context that travels in a Temporal header, and how it becomes a CallContext.

One header (``taskplane-context``, JSON) carries everything a call needs to know about
its task: who (task, session, tenant, agent), how urgent (priority, absolute deadline),
how far along (step, steps remaining) and how much is sunk. Interceptors put it on
every activity, child workflow and continue-as-new; the ``llm_call`` activity turns it
into the gateway headers of :mod:`taskplane.context`, the one place that contract lives.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime

from temporalio.api.common.v1 import Payload

from taskplane.context import CallContext, Priority

HEADER_KEY = "taskplane-context"
_ENCODING = b"json/plain"


@dataclass
class TaskContext:
    """A task's context at one point of its life (plain JSON fields only)."""

    task_id: str
    agent: str
    tenant: str = "default"
    priority: str = "standard"
    session_id: str | None = None
    deadline: str | None = None  # absolute, ISO 8601 with time zone
    max_cost_usd: float | None = None
    step: int = 0  # index of the LLM call this context belongs to (calls made so far for tools)
    steps_remaining: int | None = None
    expected_steps: int | None = None  # author's estimate of LLM calls in the task
    learned_steps: int | None = None  # learned from the agent's history
    sunk_cost_usd: float = 0.0  # this task's own spend, sub-agents included
    child_cost_usd: float = 0.0  # the part of sunk_cost_usd its sub-agents spent
    inherited_cost_usd: float = 0.0  # the parent's spend when this sub-agent started
    llm_calls: int = 0  # this task's own calls
    attempts: int = 0
    child_llm_calls: int = 0  # its sub-agents' calls and attempts (rolled up)
    child_attempts: int = 0
    children: int = 0
    started_at: str | None = None
    run: int = 0  # continue-as-new generation
    parent_task_id: str | None = None
    root_task_id: str | None = None  # a sub-agent's goal: the task at the top of its tree
    allow_fallback: bool = False
    tool: str | None = None  # the step (tool) run since the task's last LLM call: the next call's hint

    # --- header encoding -------------------------------------------------------------

    def to_payload(self) -> Payload:
        return Payload(metadata={"encoding": _ENCODING}, data=json.dumps(asdict(self)).encode())

    @classmethod
    def from_payload(cls, payload: Payload) -> TaskContext:
        raw = json.loads(payload.data.decode())
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    # --- derived values --------------------------------------------------------------

    @property
    def deadline_dt(self) -> datetime | None:
        return parse_time(self.deadline)

    @property
    def total_sunk_usd(self) -> float:
        """What the goal has cost so far: the parent's spend at spawn plus this task's own."""
        return self.inherited_cost_usd + self.sunk_cost_usd

    def budget_ms(self, now: datetime) -> float | None:
        """Milliseconds left until the deadline (negative once it has passed)."""
        deadline = self.deadline_dt
        if deadline is None:
            return None
        return (deadline - now).total_seconds() * 1000.0

    def call_context(self, *, now: datetime, attempt: int = 1) -> CallContext:
        """The gateway's view of this context for one attempt of one call."""
        budget = self.budget_ms(now)
        try:
            priority = Priority(self.priority)
        except ValueError:
            priority = Priority.STANDARD
        return CallContext(
            tenant=self.tenant,
            task_id=self.task_id,
            session_id=self.session_id or self.task_id,
            step=self.step,
            steps_remaining=self.steps_remaining,
            priority=priority,
            budget_ms=None if budget is None else max(budget, 0.0),
            sunk_cost_usd=max(self.total_sunk_usd, 0.0),
            allow_fallback=self.allow_fallback,
            agent=self.agent,
            attempt=max(attempt, 1),
            call_id=f"{self.task_id}:{self.step}",
            tool=self.tool,
        )

    def copy(self, **changes: object) -> TaskContext:
        return replace(self, **changes)  # type: ignore[arg-type]


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    dt = datetime.fromisoformat(value)
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def format_time(value: datetime | None) -> str | None:
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
