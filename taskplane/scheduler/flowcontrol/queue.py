"""Admission control (axis 5 and "delay the work"): a queue in front of each pool.

Order of service, from the outside in:

1. **priority band**: critical > interactive > standard > batch; a band is served only
   when every more urgent band is empty;
2. **weighted fair share between tenants** inside a band: start-time fair queueing — each
   tenant's next call gets a virtual start tag ``max(tenant's last finish, band clock)``,
   the smallest tag goes first, and serving it advances the tenant's finish by
   ``cost / weight``. A tenant with weight 2 gets twice the calls (or tokens) of a tenant
   with weight 1 while both have work queued; a tenant returning from idle gets no credit
   for the time it was away;
3. **earliest deadline first** inside a tenant's share (calls without a deadline last; ties
   go to the call with more money sunk into its task, then first come).

EDF is applied inside a tenant rather than across tenants on purpose: across tenants a
tenant could take the whole band by sending tight deadlines.

The queue is plain data driven by the caller with explicit times, so the asyncio gateway
and the discrete-event simulator use it the same way (through ``FlowControl.decide`` and
``FlowControl.release``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from taskplane.scheduler.flowcontrol.settings import band_rank
from taskplane.scheduler.types import CallRequest, Priority
from taskplane.scheduler.workflow import task_value


@dataclass(slots=True, eq=False)
class QueuedCall:
    call: CallRequest
    seq: int  # arrival order
    band: int
    tenant: str
    enqueued_s: float
    deadline_s: float  # absolute (inf when the call has no budget)
    value: float  # money at risk (workflow context)
    cost: float  # fair-share units
    service_s: float  # best predicted service time on an idle replica
    live: bool = True
    # how long a hold may last before the call is admitted past the rule that held it
    # (the slowdown the hold spares the others: flowcontrol/holdcost.py); inf: no cap
    max_hold_s: float = math.inf

    @property
    def key(self) -> tuple[float, float, int]:
        return (self.deadline_s, -self.value, self.seq)


@dataclass(slots=True)
class _Band:
    heaps: dict[str, list[tuple[float, float, int, QueuedCall]]] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)  # tenant -> virtual finish tag
    clock: float = 0.0  # start tag of the call last served
    size: int = 0


class AdmissionQueue:
    """The queue of one pool (one model)."""

    def __init__(
        self,
        pool: str,
        *,
        weight_of: Callable[[str], float] | Mapping[str, float] | None = None,
        fair_unit: str = "tokens",
        edf: bool = True,
    ) -> None:
        self.pool = pool
        self.edf = edf
        if weight_of is None:
            self._weight: Callable[[str], float] = lambda _t: 1.0
        elif isinstance(weight_of, Mapping):
            table = dict(weight_of)
            self._weight = lambda t: float(table.get(t, 1.0))
        else:
            self._weight = weight_of
        self.fair_unit = fair_unit
        self._bands = [_Band() for _ in Priority]
        self._entries: dict[int, QueuedCall] = {}  # id(call) -> entry
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[QueuedCall]:
        return iter(list(self._entries.values()))

    def __contains__(self, call: object) -> bool:
        return id(call) in self._entries

    def depths(self) -> dict[str, int]:
        return {p.value: self._bands[p.rank].size for p in Priority}

    # -- in

    def push(self, call: CallRequest, now_s: float, *, service_s: float = 0.0) -> QueuedCall:
        band = band_rank(call.priority)
        deadline = now_s + call.budget_ms / 1000.0 if call.budget_ms is not None else math.inf
        cost = 1.0 if self.fair_unit == "calls" else float(max(call.prompt_tokens + call.max_tokens, 1))
        self._seq += 1
        entry = QueuedCall(
            call=call, seq=self._seq, band=band, tenant=call.tenant, enqueued_s=now_s, deadline_s=deadline,
            value=task_value(call), cost=cost, service_s=service_s,
        )
        b = self._bands[band]
        heap = b.heaps.get(call.tenant)
        if heap is None:
            heap = b.heaps[call.tenant] = []
        heapq.heappush(heap, (deadline if self.edf else math.inf, -entry.value, entry.seq, entry))
        b.size += 1
        self._entries[id(call)] = entry
        return entry

    # -- out

    def _top(self, heap: list[tuple[float, float, int, QueuedCall]]) -> QueuedCall | None:
        while heap and not heap[0][3].live:
            heapq.heappop(heap)
        return heap[0][3] if heap else None

    def _choose(self) -> tuple[_Band, str, QueuedCall] | None:
        for b in self._bands:
            if b.size == 0:
                continue
            best: tuple[float, str, QueuedCall] | None = None
            for tenant, heap in list(b.heaps.items()):
                top = self._top(heap)
                if top is None:
                    del b.heaps[tenant]
                    continue
                start = max(b.finish.get(tenant, 0.0), b.clock)
                if best is None or (start, tenant) < (best[0], best[1]):
                    best = (start, tenant, top)
            if best is not None:
                return b, best[1], best[2]
        return None

    def peek(self) -> QueuedCall | None:
        """The call admission would release next."""
        chosen = self._choose()
        return chosen[2] if chosen else None

    def pop(self) -> QueuedCall | None:
        """Release the next call and charge its tenant's fair share."""
        chosen = self._choose()
        if chosen is None:
            return None
        b, tenant, entry = chosen
        heapq.heappop(b.heaps[tenant])
        if not b.heaps[tenant]:
            del b.heaps[tenant]
        start = max(b.finish.get(tenant, 0.0), b.clock)
        b.finish[tenant] = start + entry.cost / max(self._weight(tenant), 1e-9)
        b.clock = start
        self._forget(entry)
        return entry

    def remove(self, call: CallRequest) -> QueuedCall | None:
        """Take ``call`` out of the queue (cancelled, shed or timed out)."""
        entry = self._entries.get(id(call))
        if entry is None:
            return None
        self._forget(entry)
        return entry

    def _forget(self, entry: QueuedCall) -> None:
        if entry.live:
            entry.live = False
            self._bands[entry.band].size -= 1
            self._entries.pop(id(entry.call), None)

    def expired(self, now_s: float) -> list[QueuedCall]:
        """Remove and return calls that can no longer finish by their deadline."""
        gone = [e for e in self._entries.values() if now_s + e.service_s > e.deadline_s]
        for e in gone:
            self._forget(e)
        return gone

    # -- shedding support

    def ahead(self, band: int) -> int:
        """Calls served before a new call of ``band`` at the latest (every call of an equal or
        more urgent band; fair share may let it pass some of its own band)."""
        return sum(self._bands[i].size for i in range(band + 1))

    def has_at_or_above(self, band: int) -> bool:
        bands = self._bands
        for i in range(band + 1):  # a plain loop: this runs on every decision
            if bands[i].size:
                return True
        return False

    def victim(self) -> QueuedCall | None:
        """The call to shed first: least urgent band, least money at risk, latest deadline."""
        for b in reversed(self._bands):
            if b.size == 0:
                continue
            live = [h[3] for heap in b.heaps.values() for h in heap if h[3].live]
            if live:
                return min(live, key=lambda e: (e.value, -e.deadline_s, -e.seq))
        return None
