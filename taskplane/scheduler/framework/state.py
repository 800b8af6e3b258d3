"""The per-decision state: everything one decision over a pool computes once and its
plugins share (replica columns as numpy arrays, prefix matches, latency predictions,
saturation), reading the scheduler's state only through the plugins' :class:`Handle`."""

from __future__ import annotations

import functools

import numpy as np

from taskplane.scheduler.adapter_cost import adapter_terms
from taskplane.scheduler.framework.handle import Handle
from taskplane.scheduler.framework.normalise import ratio_low_is_better
from taskplane.scheduler.latency import Prediction
from taskplane.scheduler.swapcost import swap_priced
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.types import CallRequest, ReplicaView


class CycleState:
    """Everything one decision computes once and its plugins share.

    The pool is the table rows serving the call's model (``rows``); arrays are over the
    pool, and ``sel`` holds the pool positions of the candidates still in play. Plugins read
    candidate values with ``state.c(array)``.
    """

    def __init__(
        self,
        handle: Handle,
        request: CallRequest,
        table: ReplicaTable,
        rows: np.ndarray,
        now_s: float,
        model: str,
    ) -> None:
        self.handle = handle
        self.request = request
        self.table = table
        self.rows = rows
        self.now_s = now_s
        self.model = model
        self.n = n = len(rows)
        # the pool's first table row when its rows are one contiguous run (the usual case), else -1
        self._start = int(rows[0]) if n and int(rows[-1]) - int(rows[0]) + 1 == n else -1
        cols = table.columns(rows)  # read-only from here on
        self.free = cols[:, 0]
        self.total = np.maximum(cols[:, 1], 1.0)
        self.running = cols[:, 2]
        self.waiting = cols[:, 3]
        self.inflight_prefill = cols[:, 4]
        self.inflight_decode = cols[:, 5]
        self.cost_per_hour = cols[:, 6]
        self.max_seqs = np.maximum(cols[:, 7], 1.0)
        self.block_size = np.maximum(cols[:, 8], 1.0)
        self.healthy = cols[:, 9] > 0.0
        self.loaded = cols[:, 10] > 0.0
        self.host_total = cols[:, 12]  # host-tier KV blocks (0: GPU only)
        self.sleep_level = cols[:, 13]  # of the models asleep on a multi-model replica
        self.swap_ready_s = cols[:, 14]  # when a swap under way ends (0: none)
        # replicas hosting the model asleep (None: none does, every single-model fleet): a call
        # there costs a swap, priced in the prediction; their weights are not warm for it
        self.asleep = table.asleep_mask(rows, model)
        self._weights = self.loaded  # resident on the replica (awake or asleep): no cold start
        if self.asleep is not None:
            self.loaded = self.loaded & ~self.asleep
        self.sel = _everyone(n)
        self._all = True  # sel is the whole pool
        self.rng = handle.rng
        self._matched: dict[str, np.ndarray] = {}
        self._speed: np.ndarray | None = None
        self._fastest: float | None = None
        self._prediction: Prediction | None = None
        self._saturated: np.ndarray | None = None
        self._room: np.ndarray | bool | None = False  # False: not computed yet
        self._busy: np.ndarray | None = None
        self._overflow: np.ndarray | None = None
        self._needed: np.ndarray | None = None
        self._pinned = -2  # -2: not looked up yet
        self.pinned_name: str | None = None
        self.completion_tokens = handle.latency.expected_completion_tokens(model, request.max_tokens)
        self.saturation_waiting = handle.load.max_waiting

    # -- candidates

    def c(self, arr: np.ndarray) -> np.ndarray:
        """``arr`` restricted to the current candidates (read-only: while every replica of
        the pool is a candidate, as in about half of all decisions, it is ``arr`` itself)."""
        return arr if self._all else arr[self.sel]

    def narrow(self, keep: np.ndarray, kept: int | None = None) -> int:
        """Keep the candidates where ``keep`` (a mask over them) is True; returns how many
        were dropped. ``kept``: ``count_nonzero(keep)``, when the caller has it already."""
        dropped = len(keep) - (int(np.count_nonzero(keep)) if kept is None else kept)
        if dropped:
            self.sel = self.sel[keep]
            self._all = False
            self._speed = self._fastest = None
        return dropped

    def candidate_position(self, i: int) -> int:
        """Position among the candidates of pool position ``i``, or -1 when it is not one
        (``sel`` is in pool order: narrowing keeps the order)."""
        if self._all:
            return i if 0 <= i < self.n else -1
        sel = self.sel
        pos = int(sel.searchsorted(i))
        return pos if pos < len(sel) and sel[pos] == i else -1

    def view(self, i: int) -> ReplicaView:
        """The replica at pool position ``i``."""
        return self.table.views[int(self.rows[i])]

    def name(self, i: int) -> str:
        return self.table.names[int(self.rows[i])]

    @property
    def names(self) -> list[str]:
        names = self.table.names
        return [names[i] for i in self.rows]

    @property
    def gpu_codes(self) -> np.ndarray:
        """Per pool position, an index into ``table.gpus``."""
        return self.table.gpu_codes[self.rows]

    def position_of(self, name: str) -> int:
        """Pool position of replica ``name``, or -1."""
        row = self.table.row_of(name)
        if row is None:
            return -1
        if self._start >= 0:
            pos = row - self._start
            return pos if 0 <= pos < self.n else -1
        hit = np.flatnonzero(self.rows == row)
        return int(hit[0]) if hit.size else -1

    # -- prompt

    @property
    def prompt_blocks(self) -> int:
        req = self.request
        return max(len(req.block_hashes), req.prompt_tokens // max(req.block_size, 1))

    def matched(self, source: str = "auto") -> np.ndarray:
        """Leading prompt blocks each pool replica holds (from the scheduler's KV index)."""
        arr = self._matched.get(source)
        if arr is None:
            req = self.request
            if req.block_hashes:
                index = self.handle.kv_index
                ids = self._ids()
                arr = index.match_ids(
                    req.block_hashes, ids, source=source, block_size=req.block_size, tokenized=req.tokenized
                ).astype(np.float64)
            else:
                arr = np.zeros(self.n)
            if self.asleep is not None:  # a swap starts the model's KV cache empty
                arr = np.where(self.asleep | (self.swap_ready_s > self.now_s), 0.0, arr)
            self._matched[source] = arr
        return arr

    def _ids(self) -> np.ndarray:
        """The pool's replica ids in the KV index."""
        ids = self.table.ids_for(self.handle.kv_index.slots)
        return ids[self._start : self._start + self.n] if self._start >= 0 else ids[self.rows]

    def tier_matched(self, source: str = "auto") -> np.ndarray:
        """Leading prompt blocks each pool replica holds on GPU or, past its GPU prefix, in
        its host tier (>= ``matched``; equal when no replica reports a host tier)."""
        key = "tier:" + source
        arr = self._matched.get(key)
        if arr is None:
            gpu = self.matched(source)
            tiers = self.handle.kv_index.precise.tiers
            arr = tiers.depths(self.request.block_hashes, self._ids(), gpu) if tiers and self.request.block_hashes else gpu
            self._matched[key] = arr
        return arr

    def uncached_tokens(self, source: str = "auto") -> np.ndarray:
        req = self.request
        return np.maximum(req.prompt_tokens - self.matched(source) * req.block_size, 0.0)

    def new_blocks_needed(self) -> np.ndarray:
        """KV blocks this call will allocate on each replica (prompt suffix + completion)."""
        if self._needed is None:
            need_tokens = self.request.prompt_tokens + self.completion_tokens
            self._needed = np.maximum(np.ceil(need_tokens / self.block_size) - self.matched(), 0.0)
        return self._needed

    # -- predictions

    @property
    def queued_tokens(self) -> np.ndarray:
        avg_prompt = self.handle.latency.expected_prompt_tokens(self.model)
        return np.maximum(self.inflight_prefill, self.waiting * avg_prompt)

    @property
    def prediction(self) -> Prediction:
        """Predicted queue, prefill, decode, TTFT and total milliseconds per pool replica."""
        if self._prediction is None:
            lat = self.handle.latency
            gpus = self.table.gpus
            # a fleet (or cell) of one GPU generation: its parameters as scalars
            params = lat.gpu_row(gpus[0]) if len(gpus) == 1 else lat.gpu_params(gpus)[self.gpu_codes]
            adapter = self.request.adapter
            pred = lat.predict(
                params=params,
                uncached_tokens=self.uncached_tokens(),
                queued_tokens=self.queued_tokens,
                running=self.running,
                loaded=self._weights,
                completion_tokens=self.completion_tokens,
                adapter=adapter_terms([self.view(i) for i in range(self.n)], adapter, lat.adapter_costs,
                                      self.handle.adapter_warmth) if adapter else None,
            )
            if self.asleep is not None:
                pred = swap_priced(pred, asleep=self.asleep, level=self.sleep_level,
                                   ready_in_s=np.maximum(self.swap_ready_s - self.now_s, 0.0), running=self.running,
                                   inflight_decode=self.inflight_decode, costs=self.handle.swap)
            self._prediction = pred
        return self._prediction

    @property
    def fastest_total(self) -> float:
        """The candidates' smallest predicted total ms (the budget check and the latency
        scorers need it: computed once per candidate set)."""
        if self._fastest is None:
            self._fastest = float(self.c(self.prediction.total_ms).min())
        return self._fastest

    @property
    def relative_speed(self) -> np.ndarray:
        """``ratio_low_is_better`` of the candidates' predicted total times: 1 for the
        fastest. Several scorers rank by it, so it is computed once per candidate set."""
        if self._speed is None:
            self._speed = ratio_low_is_better(self.c(self.prediction.total_ms), lowest=self.fastest_total)
        return self._speed

    # -- load

    @property
    def saturated(self) -> np.ndarray:
        """Replicas that should take no more work now (admission holds calls instead).

        For the first call of a task, also the replicas without working-set room for it
        (see :attr:`room`)."""
        if self._saturated is None:
            sat = self.busy
            room = self.room
            self._saturated = sat if room is None else sat | ~room
        return self._saturated

    @property
    def busy(self) -> np.ndarray:
        """Replicas saturated for capacity alone (engine queue, batch, free KV blocks), the
        working-set room aside: where flow control may still place a call it decides not
        to hold for room."""
        if self._busy is None:
            self._busy = (
                (self.waiting >= self.saturation_waiting)
                | (self.running >= self.max_seqs)
                | (self.free < self.new_blocks_needed())
            )
        return self._busy

    @property
    def room_overflow(self) -> np.ndarray | None:
        """With :attr:`room` in force: per pool replica, the pinned context tokens that
        admitting this call there would push past the room limit (0 where it fits)."""
        if self.room is None:
            return None
        return self._overflow

    @property
    def starts_task(self) -> bool:
        """The call opens a task (step 0, or no step given and no live session pin)."""
        step = self.request.step
        return step == 0 if step is not None else self.pinned < 0

    @property
    def room(self) -> np.ndarray | None:
        """For a task's first call under working-set admission: the pool replicas whose
        pinned sessions' contexts plus this call's fit in the band's share of their KV
        cache. None when the check does not apply (later steps, no limit for the band, a
        budget too short to wait out a refusal)."""
        if self._room is False:
            self._room = None
            rule = self.handle.load.room_limit
            pins = self.handle.sessions
            limit = None if rule is None or pins is None else rule(self.request, lambda: self.starts_task)
            if limit is not None and pins is not None:
                pins.sweep(self.now_s)
                ws = pins.working_sets_of_rows(self.table, self.rows)
                need = self.request.prompt_tokens + self.completion_tokens
                allowed = self.handle.load.room_tokens(limit, self.total, self.host_total, self.block_size)
                self._room = ws + need <= allowed
                self._overflow = np.maximum(ws + need - allowed, 0.0)
        return self._room  # type: ignore[return-value]

    @property
    def pinned(self) -> int:
        """Pool position of the session's live pin, or -1."""
        if self._pinned == -2:
            self._pinned = -1
            req = self.request
            session = req.session_id or req.task_id
            pins = self.handle.sessions
            if session is not None and pins is not None:
                name = pins.get(session, self.now_s)
                self.pinned_name = name
                if name is not None:
                    self._pinned = self.position_of(name)
        return self._pinned


@functools.cache
def _everyone(n: int) -> np.ndarray:
    """``arange(n)``, shared read-only: every decision over a pool of n starts from it."""
    sel = np.arange(n)
    sel.flags.writeable = False
    return sel
