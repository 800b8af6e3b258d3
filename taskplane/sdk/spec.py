"""What ``@agent(...)`` was told: the one record the decorator, the runtime and the client share.

Its own module so the per-task runtime can name it without importing the decorator
(``sdk/agent`` builds on ``sdk/runtime``; the reverse import would be a loop).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

DEFAULT_HISTORY_LIMIT = 10_000

#: A task's Temporal execution timeout is its deadline plus this: the agent itself ends at
#: the deadline (and records its row); the timeout only bounds a task no worker runs.
DEADLINE_GRACE = timedelta(seconds=30)


def execution_timeout(deadline: datetime | None, now: datetime) -> timedelta | None:
    """Temporal's execution timeout for a task with this absolute deadline (None: no deadline)."""
    if deadline is None:
        return None
    return max(deadline - now, timedelta(0)) + DEADLINE_GRACE


@dataclass(frozen=True)
class AgentSpec:
    """What ``@agent(...)`` was told."""

    name: str
    fn: Callable[..., Awaitable[Any]]
    tenant: str | None = None
    priority: str = "standard"
    deadline: timedelta | None = None
    max_cost_usd: float | None = None
    steps: int | None = None
    allow_fallback: bool = False
    history_limit: int = DEFAULT_HISTORY_LIMIT
    model: str | None = None  # the model of llm calls that name none
    adapter: str | None = None  # the LoRA adapter of llm calls on ``model`` that name none
