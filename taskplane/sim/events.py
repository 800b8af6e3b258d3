"""The cluster simulator's virtual-time event queue.

Events come out in (time, kind, push order) order, so the same inputs give the same
run. The events known at the start (every task's first arrival, the outages) are sorted
once and fed to the heap one at a time, rather than kept in it for the whole run (a deep
heap: each pop would sift through ~log2(tasks) levels); their push order is the order
they were given in, as if they had been pushed one by one.
"""

from __future__ import annotations

import enum
import heapq
import math
from typing import Any


class Event(enum.IntEnum):
    """Event kinds, in the order they are handled at equal times: arrivals first, so calls
    that arrive together start in the same engine step."""

    ARRIVAL = 0  # a call arrives (payload: (task, k)) or is offered again (payload: the call)
    OUTAGE = 1  # (replica, up)
    WAKE = 2  # a replica's engine has something to do (payload: replica)
    TICK = 3  # offer queued calls again
    PREFETCH = 4  # bring a session's KV back from the host tier (payload: lifetimes.Prefetch)
    CONTROL = 5  # a subclass's own event (taskplane.sim.elastic: autoscaler ticks, replicas ready)
    DEMOTE = 6  # a session's KV goes first when room is needed from now (payload: lifetimes.Demotion)


Entry = tuple[float, Event, int, Any]  # (time, kind, push order, payload)


class EventQueue:
    """A heap of events, plus each replica's one live wake-up (earlier ones go stale)."""

    __slots__ = ("_heap", "_initial", "_n_initial", "_next", "_seq", "_wake_seq")

    def __init__(self, initial: list[tuple[float, Event, Any]], n_replicas: int) -> None:
        # push order numbers are unique: sorting never compares payloads
        self._initial: list[Entry] = sorted((t, kind, i, payload) for i, (t, kind, payload) in enumerate(initial, 1))
        self._n_initial = len(self._initial)
        self._next = 1  # the next initial event to feed
        self._heap: list[Entry] = self._initial[:1]
        self._seq = self._n_initial
        self._wake_seq = [0] * n_replicas  # push order of each replica's live wake entry (0: none)

    def push(self, t: float, kind: Event, payload: Any) -> int:
        """Add an event; returns its push order number."""
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))
        return self._seq

    def pop(self) -> Entry | None:
        """The next event, or None when there is none left."""
        heap = self._heap
        if not heap:
            return None
        entry = heap[0]
        if entry[2] <= self._n_initial and self._next < self._n_initial:  # the next initial one takes its place
            heapq.heapreplace(heap, self._initial[self._next])
            self._next += 1
        else:
            heapq.heappop(heap)
        return entry

    def set_wake(self, replica: int, t: float) -> None:
        """Replica ``replica``'s next wake-up is at ``t`` (``math.inf``: none)."""
        self._wake_seq[replica] = self.push(t, Event.WAKE, replica) if t < math.inf else 0

    def is_live_wake(self, entry: Entry) -> bool:
        """Whether a WAKE entry is its replica's latest (not superseded since it was armed)."""
        return entry[2] == self._wake_seq[entry[3]]
