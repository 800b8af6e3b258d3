"""The event loop the front door runs on.

The picker's process spends most of its CPU at agent rates on per-wakeup work, not on the
decisions: grpc.aio's poller thread wakes the loop once per completion-queue event (a byte
on a socket pair), and every wakeup is a turn of the loop. uvloop runs those turns in C;
asyncio's own loop runs them in Python. ``TASKPLANE_EVENT_LOOP`` picks: ``uvloop`` (the
default when it is installed) or ``asyncio``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop, unless ``TASKPLANE_EVENT_LOOP=asyncio`` or uvloop is not installed."""
    choice = os.environ.get("TASKPLANE_EVENT_LOOP", "uvloop")
    if choice not in ("uvloop", "asyncio"):
        raise ValueError(f"TASKPLANE_EVENT_LOOP must be uvloop or asyncio, not {choice!r}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
