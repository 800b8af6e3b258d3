"""The agent author's SDK: ``@agent``, ``@step``, ``llm``, ``submit`` and friends.

    from taskplane import agent, step, llm

    @step(retries=2)
    async def search(query: str) -> list[str]: ...

    @agent(name="research", tenant="acme", deadline=timedelta(minutes=2))
    async def research(question: str) -> str:
        plan = await llm.chat(model="llama-3.1-8b", messages=[{"role": "user", "content": question}])
        hits = await search(plan.text)
        ...

See docs/sdk.md for the whole guide.
"""

from __future__ import annotations

from taskplane.sdk import llm
from taskplane.sdk.agent import Agent, agent
from taskplane.sdk.client import TaskHandle, connect, get_handle, submit
from taskplane.sdk.control import (
    approval,
    continue_as_new,
    current_context,
    should_continue_as_new,
)
from taskplane.sdk.errors import (
    AgentError,
    BudgetExceeded,
    DeadlineExceeded,
    LlmError,
    NotDeterministic,
    StepFailed,
    StructuredOutputError,
    SubAgentFailed,
    TaskFailed,
)
from taskplane.sdk.step import Step, step
from taskplane.sdk.types import AgentOutput, Decision, LlmResponse, TaskView, ToolCall

__all__ = [
    "Agent",
    "AgentError",
    "AgentOutput",
    "BudgetExceeded",
    "DeadlineExceeded",
    "Decision",
    "LlmError",
    "LlmResponse",
    "NotDeterministic",
    "Step",
    "StepFailed",
    "StructuredOutputError",
    "SubAgentFailed",
    "TaskFailed",
    "TaskHandle",
    "TaskView",
    "ToolCall",
    "agent",
    "approval",
    "connect",
    "continue_as_new",
    "current_context",
    "get_handle",
    "llm",
    "should_continue_as_new",
    "step",
    "submit",
]
