"""What ``@agent(...)`` was told: the one record the decorator, the runtime and the client share.

Its own module so the per-task runtime can name it without importing the decorator
(``sdk/agent`` builds on ``sdk/runtime``; the reverse import would be a loop).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

DEFAULT_HISTORY_LIMIT = 10_000


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
