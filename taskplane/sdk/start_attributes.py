"""What a task shows in the Temporal UI from its start: its memo and search attributes.

Written by whoever starts the task (the client's ``submit``, a parent starting a sub-agent)
or, failing that, by the task's own first run.
"""

from __future__ import annotations

from typing import Any

from temporalio.common import SearchAttributePair

from taskplane import temporal_names as tn
from taskplane.sdk.convert import summarize_args
from taskplane.sdk.state import TaskContext, parse_time

#: The memo key naming the agent's module, so a worker that lacks the agent can say what to import.
MODULE_MEMO = "module"


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
