"""What the cost writer's appender, its delivery loop and its ``flush`` share: how many rows
are accepted but not yet in Postgres, and the events by which each wakes the others."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

#: runs a blocking outbox call on the writer's one outbox thread
OutboxCall = Callable[..., Awaitable[Any]]


@dataclass(eq=False)
class Backlog:
    #: rows appended (or being appended) to the outbox and not yet committed to Postgres
    pending: int = 0
    #: not started, or ``close()`` began: no new rows, and the send loop ends once the outbox is empty
    closed: bool = True
    #: rows were appended: the send loop looks at the outbox again
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: a batch was committed (or failed): ``flush()`` re-checks
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    #: ``flush()`` or ``close()`` waits: send without gathering
    urgent: asyncio.Event = field(default_factory=asyncio.Event)
    #: ``close()``: a backoff sleep ends early
    stop: asyncio.Event = field(default_factory=asyncio.Event)
