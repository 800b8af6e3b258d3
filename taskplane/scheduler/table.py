"""The fleet as a struct of arrays, so a decision does no per-replica Python work.

A decision over a plain ``list[ReplicaView]`` first copies every replica's numbers into
numpy columns: O(replicas) Python work, about a microsecond per replica. A caller deciding
often over a large fleet (the gateway, the cluster simulator) keeps a ``ReplicaTable``
instead and updates it when a replica's state changes (``update``, ``upsert``,
``remove``); ``Scheduler.decide`` accepts either.

Updates replace the ``ReplicaView`` object of a row (never mutate it), so views handed out
earlier stay as they were.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from operator import attrgetter
from typing import Any

import numpy as np

from taskplane.scheduler.types import ReplicaView

#: numeric columns, in order (booleans as 0/1)
COLUMNS: tuple[str, ...] = (
    "kv_blocks_free",
    "kv_blocks_total",
    "num_running",
    "num_waiting",
    "inflight_prefill_tokens",
    "inflight_decode_tokens",
    "cost_per_hour_usd",
    "max_num_seqs",
    "block_size",
    "healthy",
    "model_loaded",
    "has_kv_events",
    "kv_host_blocks_total",
    "sleep_level",
    "swap_ready_s",
)
COL = {name: i for i, name in enumerate(COLUMNS)}
_ROW = attrgetter(*COLUMNS)


class ReplicaTable:
    """Replicas by row: the views, their names, models, GPU codes and numeric columns."""

    def __init__(self, views: Iterable[ReplicaView] = ()) -> None:
        views = list(views)
        self.views: list[ReplicaView] = views
        self.names: list[str] = [v.name for v in views]
        self._pos: dict[str, int] = {n: i for i, n in enumerate(self.names)}
        if len(self._pos) != len(views):
            raise ValueError("replica names must be unique")
        self.gpus: list[str] = []  # distinct GPU names; gpu_codes index into it
        self._gpu_code: dict[str, int] = {}
        self.gpu_codes = np.fromiter((self._code(v.gpu) for v in views), dtype=np.intp, count=len(views))
        # column-major: each column is contiguous, which is how decisions read them
        self.cols = np.asfortranarray(
            np.array(list(map(_ROW, views)), dtype=np.float64).reshape(len(views), len(COLUMNS))
        )
        self.version = 0  # bumped when rows are added, removed or change model
        self._pools: dict[str, np.ndarray] = {}
        self._key: tuple[str, ...] | None = None
        self._ids: dict[int, tuple[Any, np.ndarray]] = {}  # id(slots) -> (token, ids by row)
        self._multi: bool | None = None  # some replica hosts a model asleep (None: not looked at yet)

    # -- reading

    def __len__(self) -> int:
        return len(self.views)

    def __iter__(self) -> Iterator[ReplicaView]:
        return iter(self.views)

    def get(self, name: str) -> ReplicaView | None:
        i = self._pos.get(name)
        return self.views[i] if i is not None else None

    def row_of(self, name: str) -> int | None:
        return self._pos.get(name)

    def _code(self, gpu: str) -> int:
        code = self._gpu_code.get(gpu)
        if code is None:
            code = self._gpu_code[gpu] = len(self.gpus)
            self.gpus.append(gpu)
        return code

    def gpu_code(self, gpu: str) -> int | None:
        return self._gpu_code.get(gpu)

    def pool(self, model: str) -> np.ndarray:
        """Rows of the replicas serving whole calls of ``model``: every role but "prefill"
        (a prefill-only replica computes prompts for decode replicas, it never generates).
        Cached until membership or a role changes."""
        rows = self._pools.get(model)
        if rows is None:
            rows = np.fromiter(
                (i for i, v in enumerate(self.views)
                 if (v.model == model or model in v.models_asleep) and v.role != "prefill"), dtype=np.intp
            )
            self._pools[model] = rows
        return rows

    def asleep_mask(self, rows: np.ndarray, model: str) -> np.ndarray | None:
        """Per row of ``rows`` (a pool of ``model``): True where the replica hosts ``model``
        asleep, so a call there costs a swap. None when no replica of the table hosts a model
        asleep (every single-model fleet): nothing is computed for them."""
        if self._multi is None:
            self._multi = any(v.models_asleep for v in self.views)
        if not self._multi:
            return None
        views = self.views
        return np.fromiter((views[i].model != model for i in rows), dtype=bool, count=len(rows))

    def without(self, rows: np.ndarray, avoid: tuple[str, ...]) -> np.ndarray:
        """``rows`` less the replicas named in ``avoid`` (a retry's failed replicas)."""
        if not avoid or not len(rows):
            return rows
        names = self.names
        return rows[np.fromiter((names[i] not in avoid for i in rows), dtype=bool, count=len(rows))]

    def prefill_pool(self, model: str) -> np.ndarray:
        """Rows of the replicas that compute prompts for decode replicas of ``model``: the
        prefill-role ones and, on a fleet that has decode-role replicas, the "both" ones (a
        kv_both replica serving whole calls can prefill for a decode-only one as well). Empty
        on an aggregated fleet (every replica "both", none "decode")."""
        key = "\0prefill\0" + model
        rows = self._pools.get(key)
        if rows is None:
            mine = [(i, v.role) for i, v in enumerate(self.views) if v.model == model]
            lend = any(role == "decode" for _, role in mine)
            rows = np.fromiter((i for i, role in mine if role == "prefill" or (lend and role == "both")), dtype=np.intp)
            self._pools[key] = rows
        return rows

    def columns(self, rows: np.ndarray) -> np.ndarray:
        """``cols[rows]``, without a copy when the rows are one contiguous run (the usual
        case: a pool's replicas added together)."""
        n = len(rows)
        if n and int(rows[-1]) - int(rows[0]) + 1 == n:
            return self.cols[int(rows[0]) : int(rows[-1]) + 1]
        return self.cols[rows]

    @property
    def key(self) -> tuple[str, ...]:
        """The row names in order: equal keys mean equal row numbering."""
        if self._key is None:
            self._key = tuple(self.names)
        return self._key

    def ids_for(self, slots: Any) -> np.ndarray:
        """Ids by row from ``slots`` (a ``ReplicaSlots``: the KV index's, the session
        pins'), cached until either side's membership changes."""
        token = (slots.version, self.version)
        cached = self._ids.get(id(slots))
        if cached is None or cached[0] != token:
            cached = self._ids[id(slots)] = (token, slots.ids_of(self.names))
        return cached[1]

    # -- writing

    def _changed(self) -> None:
        self.version += 1
        self._pools.clear()
        self._key = None
        self._ids = {}
        self._multi = None

    def upsert(self, view: ReplicaView) -> None:
        """Add a replica, or replace the one with the same name."""
        i = self._pos.get(view.name)
        if i is None:
            row = np.array(_ROW(view), dtype=np.float64)
            self._pos[view.name] = len(self.views)
            self.views.append(view)
            self.names.append(view.name)
            self.gpu_codes = np.append(self.gpu_codes, self._code(view.gpu))
            self.cols = np.asfortranarray(np.vstack([self.cols, row[None, :]]))
            self._changed()
            return
        old = self.views[i]
        self.views[i] = view
        self.cols[i] = _ROW(view)  # numpy converts the tuple as np.array would, without the temporary
        self.gpu_codes[i] = self._code(view.gpu)
        if old.model != view.model or old.role != view.role or old.models_asleep != view.models_asleep:
            self._changed()

    def update(self, name: str, **changes: Any) -> ReplicaView:
        """Change some fields of one replica (e.g. ``num_waiting=3``); returns the new view."""
        i = self._pos[name]
        old = self.views[i]
        new = dataclasses.replace(old, **changes)
        self.views[i] = new
        for key, value in changes.items():
            col = COL.get(key)
            if col is not None:
                self.cols[i, col] = float(value)
        if "gpu" in changes:
            self.gpu_codes[i] = self._code(new.gpu)
        if new.model != old.model or new.role != old.role or new.models_asleep != old.models_asleep:
            self._changed()
        return new

    def add(self, name: str, **deltas: float) -> None:
        """Add to numeric fields (``num_waiting=+1``): the in-flight bookkeeping fast path."""
        i = self._pos[name]
        old = self.views[i]
        changes = {k: getattr(old, k) + type(getattr(old, k))(d) for k, d in deltas.items()}
        self.update(name, **changes)

    def remove(self, name: str) -> None:
        i = self._pos.pop(name, None)
        if i is None:
            return
        del self.views[i]
        del self.names[i]
        self.gpu_codes = np.delete(self.gpu_codes, i)
        self.cols = np.asfortranarray(np.delete(self.cols, i, axis=0))
        self._pos = {n: j for j, n in enumerate(self.names)}
        self._changed()

    def copy(self) -> ReplicaTable:
        """An independent table (views are shared, but updates replace them)."""
        t = ReplicaTable.__new__(ReplicaTable)
        t.views = list(self.views)
        t.names = list(self.names)
        t._pos = dict(self._pos)
        t.gpus = list(self.gpus)
        t._gpu_code = dict(self._gpu_code)
        t.gpu_codes = self.gpu_codes.copy()
        t.cols = self.cols.copy()
        t.version = self.version
        t._pools = dict(self._pools)
        t._key = self._key
        t._ids = dict(self._ids)
        t._multi = self._multi
        return t


def as_table(replicas: ReplicaTable | Iterable[ReplicaView]) -> ReplicaTable:
    return replicas if isinstance(replicas, ReplicaTable) else ReplicaTable(replicas)
