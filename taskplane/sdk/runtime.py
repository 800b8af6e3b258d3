"""The per-task state an agent's workflow keeps while it runs.

It lives on the workflow instance (``workflow.instance()._tp``), never in module globals:
the SDK module is shared by every workflow the worker runs, the instance is not. All
its inputs are deterministic (workflow time, activity results, signals), so replays
rebuild it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from temporalio import workflow

from taskplane import temporal_names as tn
from taskplane.sdk.errors import AgentError, BudgetExceeded, DeadlineExceeded
from taskplane.sdk.spec import AgentSpec
from taskplane.sdk.state import TaskContext
from taskplane.sdk.types import Decision, TaskView

#: Spend and call-count search attributes are refreshed at most this often (workflow time).
PUBLISH_INTERVAL_S = 2.0


@dataclass
class TaskRuntime:
    """What one running task knows about itself."""

    spec: AgentSpec
    ctx: TaskContext
    status: str = "running"
    current: str = "starting"
    pending_header: TaskContext | None = None
    pending_approvals: dict[str, str] = field(default_factory=dict)
    decisions: dict[str, Decision] = field(default_factory=dict)
    reported_cost: float = -1.0
    reported_calls: int = -1
    published_at: float = 0.0

    # --- time and budget -------------------------------------------------------------

    def now(self) -> datetime:
        return workflow.now()

    def budget_ms(self) -> float | None:
        return self.ctx.budget_ms(self.now())

    def budget_left(self) -> float | None:
        """Seconds left until the deadline; raises DeadlineExceeded once none is left."""
        ms = self.budget_ms()
        if ms is None:
            return None
        if ms <= 0:
            raise DeadlineExceeded(
                f"task {self.ctx.task_id} ran out of its deadline budget "
                f"(deadline {self.ctx.deadline}); give it a longer deadline or make it do less"
            )
        return ms / 1000.0

    def check_cost(self) -> None:
        limit = self.ctx.max_cost_usd
        if limit is not None and self.ctx.sunk_cost_usd > limit:
            raise BudgetExceeded(self.ctx.sunk_cost_usd, limit)

    # --- steps -----------------------------------------------------------------------

    def steps_remaining(self, step: int, override: int | None) -> int | None:
        """The author's estimate, else what the agent's history taught, else unknown."""
        if override is not None:
            return max(override, 0)
        total = self.ctx.expected_steps or self.ctx.learned_steps
        if total is None:
            return None
        return max(total - step - 1, 0)

    def next_llm_context(self, *, steps_remaining: int | None, allow_fallback: bool | None) -> TaskContext:
        """Claim the next step index and the context its call carries."""
        step = self.ctx.step
        self.ctx.step = step + 1
        tool, self.ctx.tool = self.ctx.tool, None  # the "in a tool" hint goes on this call only
        return self.ctx.copy(
            step=step,
            steps_remaining=self.steps_remaining(step, steps_remaining),
            allow_fallback=self.ctx.allow_fallback if allow_fallback is None else allow_fallback,
            tool=tool,
        )

    def tool_context(self) -> TaskContext:
        """Context for a tool step: the LLM step count so far, nothing claimed."""
        return self.ctx.copy(steps_remaining=self.steps_remaining(self.ctx.step, None))

    def add_call(self, cost_usd: float, attempts: int) -> None:
        self.ctx.sunk_cost_usd += max(cost_usd, 0.0)
        self.ctx.llm_calls += 1
        self.ctx.attempts += max(attempts, 1)

    def add_child(self, cost_usd: float, llm_calls: int = 0, attempts: int = 0) -> None:
        """Roll a finished sub-agent's spend, calls and attempts into this task's."""
        self.ctx.sunk_cost_usd += max(cost_usd, 0.0)
        self.ctx.child_cost_usd += max(cost_usd, 0.0)
        self.ctx.child_llm_calls += max(llm_calls, 0)
        self.ctx.child_attempts += max(attempts, 0)

    @property
    def total_calls(self) -> int:
        """LLM calls of the whole tree: this task's and its sub-agents'."""
        return self.ctx.llm_calls + self.ctx.child_llm_calls

    @property
    def total_attempts(self) -> int:
        return self.ctx.attempts + self.ctx.child_attempts

    # --- Temporal UI -----------------------------------------------------------------

    def set_current(self, text: str) -> None:
        self.current = text
        spent = f"${self.ctx.sunk_cost_usd:.6f}"
        limit = f" of ${self.ctx.max_cost_usd:.4f}" if self.ctx.max_cost_usd is not None else ""
        workflow.set_current_details(
            f"**{self.status}** · {text}\n\nLLM calls: {self.total_calls} · spent {spent}{limit}"
        )

    def publish(self, *, status: str | None = None) -> None:
        """Upsert the search attributes that changed.

        A status change is published at once; spend and call count at most every
        ``PUBLISH_INTERVAL_S`` of workflow time (and with the final status): each upsert is
        a history event and a visibility write, which would otherwise cost every LLM call
        a few milliseconds of orchestration.
        """
        updates: list[Any] = []
        if status is not None and status != self.status:
            self.status = status
            updates.append(tn.STATUS.value_set(status))
        now = workflow.time()
        if not updates and now - self.published_at < PUBLISH_INTERVAL_S:
            return
        self.published_at = now
        cost = self.ctx.sunk_cost_usd
        if cost != self.reported_cost:
            self.reported_cost = cost
            updates.append(tn.COST_USD.value_set(cost))
        if self.total_calls != self.reported_calls:
            self.reported_calls = self.total_calls
            updates.append(tn.LLM_CALLS.value_set(self.total_calls))
        if updates:
            workflow.upsert_search_attributes(updates)

    def view(self) -> TaskView:
        return TaskView(
            task_id=self.ctx.task_id,
            agent=self.ctx.agent,
            tenant=self.ctx.tenant,
            priority=self.ctx.priority,
            status=self.status,
            session_id=self.ctx.session_id or self.ctx.task_id,
            step=self.ctx.step,
            llm_calls=self.total_calls,
            cost_usd=self.ctx.sunk_cost_usd,
            max_cost_usd=self.ctx.max_cost_usd,
            deadline=self.ctx.deadline,
            budget_ms_left=self.budget_ms(),
            current=self.current,
            run=self.ctx.run,
            pending_approvals=sorted(self.pending_approvals),
            decisions=list(self.decisions.values()),
        )


def runtime(what: str = "this") -> TaskRuntime:
    """The running task's state; a clear error when called outside an agent."""
    if not workflow.in_workflow():
        raise AgentError(
            f"{what} only works inside an @agent function while it runs as a task; "
            "start the agent with `await taskplane.submit(agent, ...)` or `taskplane run MODULE:AGENT`"
        )
    rt = getattr(workflow.instance(), "_tp", None)
    if rt is None:
        raise AgentError(f"{what} was used in a workflow that is not a taskplane @agent")
    return rt  # type: ignore[no-any-return]
