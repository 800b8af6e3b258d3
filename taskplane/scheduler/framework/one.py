"""The decision with one candidate: a pinned session's replica (the sticky fast path)."""

from __future__ import annotations

import math

import numpy as np

from taskplane.scheduler.adapter_cost import adapter_term
from taskplane.scheduler.framework.handle import Handle
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.latency import OnePrediction
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.types import CallRequest


class OneCandidate:
    """A decision with one candidate replica: the session's pinned one, which its call
    keeps unless a filter, the budget or admission rules it out.

    Most calls of an agent fleet continue a session, so this is the common decision. It
    offers the quantities of :class:`CycleState` (lazily, shared by the filters and the
    scheduler) as Python floats: on one-element arrays numpy's per-operation overhead is
    all of the cost. The arithmetic is the same IEEE operations in the same order, so
    every value is bit-identical to the array path's.
    """

    __slots__ = (
        "_matched",
        "_needed",
        "_prediction",
        "_room",
        "_room_known",
        "_saturated",
        "_state",
        "block_size",
        "completion_tokens",
        "free",
        "handle",
        "healthy",
        "host_total",
        "inflight_prefill",
        "loaded",
        "max_seqs",
        "model",
        "now_s",
        "request",
        "row",
        "running",
        "table",
        "total",
        "view",
        "waiting",
    )

    def __init__(self, handle: Handle, request: CallRequest, table: ReplicaTable, row: int, now_s: float) -> None:
        self.handle = handle
        self.request = request
        self.table = table
        self.row = row
        self.now_s = now_s
        self.model = request.model
        self.view = table.views[row]
        (free, total, running, waiting, prefill, _, _, max_seqs, block_size, healthy, loaded, _,
         host, *_) = table.cols[row].tolist()
        self.free = free
        self.total = max(total, 1.0)
        self.host_total = host
        self.running = running
        self.waiting = waiting
        self.inflight_prefill = prefill
        self.max_seqs = max(max_seqs, 1.0)
        self.block_size = max(block_size, 1.0)
        self.healthy = healthy > 0
        self.loaded = loaded > 0
        self.completion_tokens = handle.latency.expected_completion_tokens(self.model, request.max_tokens)
        self._matched: float | None = None
        self._needed: float | None = None
        self._prediction: OnePrediction | None = None
        self._room: bool | None = None
        self._room_known = False
        self._saturated: bool | None = None
        self._state: CycleState | None = None

    def cycle_state(self) -> CycleState:
        """The same decision as a one-row :class:`CycleState` (for filters without ``keeps``)."""
        if self._state is None:
            rows = np.array([self.row], dtype=np.intp)
            self._state = CycleState(self.handle, self.request, self.table, rows, self.now_s, self.model)
            self._state._pinned, self._state.pinned_name = 0, self.view.name  # the session's pin
        return self._state

    def matched(self) -> float:
        """Leading prompt blocks the replica holds (``CycleState.matched("auto")``)."""
        if self._matched is None:
            req = self.request
            self._matched = 0.0
            if req.block_hashes:
                index = self.handle.kv_index
                rid = self.table.ids_for(index.slots).item(self.row)
                self._matched = float(index.match_id(req.block_hashes, rid, block_size=req.block_size,
                                                     tokenized=req.tokenized))
        return self._matched

    def uncached_tokens(self) -> float:
        req = self.request
        return max(req.prompt_tokens - self.matched() * req.block_size, 0.0)

    def new_blocks_needed(self) -> float:
        """KV blocks this call will allocate (prompt suffix + completion)."""
        if self._needed is None:
            need_tokens = self.request.prompt_tokens + self.completion_tokens
            self._needed = max(float(math.ceil(need_tokens / self.block_size)) - self.matched(), 0.0)
        return self._needed

    @property
    def prediction(self) -> OnePrediction:
        """``CycleState.prediction`` for the one replica."""
        if self._prediction is None:
            lat = self.handle.latency
            queued = max(self.inflight_prefill, self.waiting * lat.expected_prompt_tokens(self.model))
            adapter = self.request.adapter
            self._prediction = lat.predict_scalar(
                lat.gpu_row(self.view.gpu),
                uncached_tokens=self.uncached_tokens(),
                queued_tokens=queued,
                running=self.running,
                loaded=self.loaded,
                completion_tokens=self.completion_tokens,
                adapter=adapter_term(self.view, adapter, lat.adapter_costs, self.handle.adapter_warmth)
                if adapter else None,
            )
        return self._prediction

    @property
    def starts_task(self) -> bool:
        """The candidate is the session's live pin, so only an explicit step 0 does."""
        return self.request.step == 0

    @property
    def room(self) -> bool | None:
        """``CycleState.room`` for the one replica."""
        if not self._room_known:
            self._room_known = True
            rule = self.handle.load.room_limit
            pins = self.handle.sessions
            limit = None if rule is None or pins is None else rule(self.request, lambda: self.starts_task)
            if limit is not None and pins is not None:
                pins.sweep(self.now_s)
                ws = pins.working_set_of_row(self.table, self.row)
                need = self.request.prompt_tokens + self.completion_tokens
                self._room = ws + need <= self.handle.load.room_tokens(limit, self.total, self.host_total,
                                                                       self.block_size)
        return self._room

    @property
    def saturated(self) -> bool:
        """``CycleState.saturated`` for the one replica."""
        if self._saturated is None:
            needed = self.new_blocks_needed()
            room = self.room
            sat = self.waiting >= self.handle.load.max_waiting or self.running >= self.max_seqs or self.free < needed
            self._saturated = sat or room is False
        return self._saturated
