"""The picker's book of routed calls, from the routing answer to their access-log entry.

A call's rows are settled by exactly one of two things, whichever the data plane gives:
an ext_proc exchange that sees the answer (a unary body, an error, a GIE-style Envoy's
response headers or streamed body), or the call's access-log entry (a stream whose
headers and usage the Lua filter handled, a unary body that broke off). The two arrive
in either order, on different gRPC streams, so the book decides who settles:

- **held**: an exchange is handling the call; an entry that comes meanwhile is kept on
  the call and handed to the exchange when it lets go (it settles from it);
- **waiting**: its rows wait for the entry (or expire); an exchange may hold it too
  (a stream whose response headers a GIE-style filter saw);
- **settled**: its rows are written; it stays a grace period for its entry, whose count
  of tries may add the row of a try no answer named (``PickedCall.reconcile``).

Settled and waiting calls are kept in the order they got there, so sweeps stop at the
first young one instead of scanning every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from taskplane.epp.calls import PickedCall

#: How long a settled call waits for its access-log entry (Envoy's count of tries) before
#: it is forgotten; an Envoy without taskplane's access log never sends one.
RECONCILE_GRACE_S = 30.0

#: An access-log entry as the book keeps it: the ``taskplane`` metadata and the entry itself.
LogEntry = tuple[dict[str, Any], Any]


@dataclass(slots=True)
class _Held:
    picked: PickedCall
    holders: int = 0  # exchanges handling the call now
    entry: LogEntry | None = None  # its log entry, come while an exchange held it


@dataclass(slots=True)
class Release:
    """What the last exchange that let go of a call must do: ``entry`` is the call's log
    entry if it came meanwhile (settle from it), else None (settle, or let it wait)."""

    picked: PickedCall
    entry: LogEntry | None


class StreamBook:
    """Every routed call until its access-log entry came (or a grace after it settled)."""

    def __init__(self) -> None:
        self._calls: dict[str, _Held] = {}
        self._waiting: dict[str, float] = {}  # key -> since (monotonic), in that order
        self._settled: deque[tuple[float, str]] = deque()  # (settled at, key), in that order
        self._empty = asyncio.Event()
        self._empty.set()

    def __len__(self) -> int:
        return len(self._calls)

    @property
    def waiting(self) -> int:
        """Calls whose rows wait for their log entry."""
        return len(self._waiting)

    def route(self, picked: PickedCall) -> None:
        """A call the routing exchange (which holds it) just placed."""
        self._calls[picked.key] = _Held(picked, holders=1)

    def take(self, key: str) -> PickedCall | None:
        """An answers exchange takes the call it is about (None: unknown, or settled already)."""
        held = self._calls.get(key)
        if held is None or held.picked.settled:
            return None
        held.holders += 1
        self._unwait(key)
        return held.picked

    def release(self, picked: PickedCall) -> Release | None:
        """An exchange lets go of its call; None when another still holds it or the book no
        longer has it (its log entry settled it): nothing more to do."""
        held = self._calls.get(picked.key)
        if held is None or held.picked is not picked:
            return None
        held.holders -= 1
        if held.holders > 0:
            return None
        if held.entry is not None:
            del self._calls[picked.key]
        return Release(picked, held.entry)

    def wait(self, picked: PickedCall) -> None:
        """The call's rows wait for its log entry (a stream the Lua filter scans, a unary
        body that broke off), held or not: a stopping front door gives them a moment."""
        if picked.key in self._calls:
            self._waiting.pop(picked.key, None)  # at the end: the order stays the order of since
            self._waiting[picked.key] = time.monotonic()
            self._empty.clear()

    def settled(self, picked: PickedCall) -> None:
        """The call's rows are written; its log entry may still add a try's row."""
        if picked.key in self._calls:
            self._settled.append((time.monotonic(), picked.key))

    def arrive(self, key: str, entry: LogEntry) -> PickedCall | None:
        """The call's log entry: the call to settle (or only reconcile) from it now, or None
        (unknown, or an exchange holds it unsettled and will settle from the entry)."""
        held = self._calls.get(key)
        if held is None:
            return None
        if held.holders > 0 and not held.picked.settled:
            held.entry = entry
            self._unwait(key)  # it waits for its exchange now, which Envoy ends
            return None
        del self._calls[key]
        self._unwait(key)
        return held.picked

    def _unwait(self, key: str) -> None:
        if self._waiting.pop(key, None) is not None and not self._waiting:
            self._empty.set()

    def forget_settled(self, grace_s: float = RECONCILE_GRACE_S) -> int:
        """Drop calls settled more than ``grace_s`` ago whose entry never came."""
        cutoff = time.monotonic() - grace_s
        n = 0
        while self._settled and self._settled[0][0] < cutoff:
            _, key = self._settled.popleft()
            held = self._calls.get(key)
            if held is not None and held.holders == 0 and held.picked.settled and key not in self._waiting:
                del self._calls[key]
                n += 1
        return n

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no call waits for its log entry, at most ``timeout_s``; whether none does."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._empty.wait(), timeout=timeout_s)
        return not self._waiting

    def _take_waiting(self, key: str) -> PickedCall | None:
        self._unwait(key)
        held = self._calls.pop(key, None)
        return held.picked if held is not None else None

    async def expire(self, max_age_s: float) -> int:
        """Settle calls whose log entry never came (lost with an Envoy restart, say), so no
        lease stays open for ever: failed, blaming nobody."""
        self.forget_settled()
        cutoff = time.monotonic() - max_age_s
        old = []
        for key, since in self._waiting.items():
            if since >= cutoff:
                break
            old.append(key)
        for key in old:
            picked = self._take_waiting(key)
            if picked is not None:
                await picked.settle()
        return len(old)

    async def abandon(self) -> int:
        """Settle every call still waiting for its log entry as cancelled (Envoy went away,
        or the picker is stopping): its rows are written now rather than lost."""
        n = 0
        while self._waiting:
            picked = self._take_waiting(next(iter(self._waiting)))
            if picked is not None:
                await picked.cancelled()
                n += 1
        self._empty.set()
        return n
