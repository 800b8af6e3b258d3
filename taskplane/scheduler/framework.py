"""The plugin framework: filters, then weighted normalised scorers, then a picker.

Modelled on the Kubernetes scheduler framework and llm-d's endpoint picker. Each plugin is a
small class with one job, a registered type name, a ``Params`` dataclass whose every field
documents its default and meaning (``param(default, doc)``), and its own metrics. Adding an
axis means adding a plugin, not editing a long function.

* a **filter** returns a boolean mask over the current candidates (None keeps them all);
* a **scorer** returns one score in [0, 1] per candidate, higher is better; the decision
  adds the scores times their configured weights;
* a **picker** chooses one candidate, by default the highest total, ties broken by a
  seeded random generator so runs are reproducible.

Everything a decision computes once and several plugins need (replica columns as numpy
arrays, prefix matches, latency predictions) lives in :class:`CycleState`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from taskplane.errors import ConfigError
from taskplane.scheduler.metrics import FILTERED, PLUGIN_SCORE
from taskplane.scheduler.types import CallRequest, ReplicaView

if TYPE_CHECKING:
    from taskplane.scheduler.core import Scheduler
    from taskplane.scheduler.latency import OnePrediction, Prediction
    from taskplane.scheduler.table import ReplicaTable


def param(default: Any, doc: str) -> Any:
    """A documented plugin parameter (``dataclasses.field`` with its help text)."""
    if isinstance(default, list | dict | set):
        factory = type(default)
        items = default
        return field(default_factory=lambda: factory(items), metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass(slots=True)
class NoParams:
    """This plugin takes no parameters."""


class Kind(enum.StrEnum):
    FILTER = "filter"
    SCORER = "scorer"
    PICKER = "picker"


class Plugin:
    """Base of every plugin. Subclasses set ``type_name`` and ``Params``."""

    kind: ClassVar[Kind]
    type_name: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams

    def __init__(self, params: Any, *, name: str | None = None, weight: float = 1.0, policy: str = "custom") -> None:
        self.params = params
        self.name = name or self.type_name
        self.weight = float(weight)
        self.policy = policy

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, weight={self.weight}, params={self.params})"


class Filter(Plugin):
    kind = Kind.FILTER

    def __init__(self, params: Any, **kw: Any) -> None:
        super().__init__(params, **kw)
        self._filtered = FILTERED.labels(self.policy, self.name)

    def filter(self, state: CycleState) -> np.ndarray | None:
        """Boolean mask over ``state.sel`` (True = keep); None keeps every candidate."""
        raise NotImplementedError

    def keeps(self, one: OneCandidate) -> bool:
        """``filter`` for a forced choice (a pinned session's replica): does the filter keep
        it? This default asks ``filter`` over a pool of that one replica; the built-in
        filters override it with the same test in plain floats (on one candidate numpy's
        per-operation overhead is all of the cost)."""
        keep = self.filter(one.cycle_state())
        return keep is None or bool(keep[0])


class Scorer(Plugin):
    kind = Kind.SCORER

    def __init__(self, params: Any, **kw: Any) -> None:
        super().__init__(params, **kw)
        self._hist = PLUGIN_SCORE.labels(self.policy, self.name)

    def score(self, state: CycleState) -> np.ndarray:
        """Scores in [0, 1] for the candidates ``state.sel`` (higher is better)."""
        raise NotImplementedError


class Picker(Plugin):
    kind = Kind.PICKER

    def pick(self, state: CycleState, totals: np.ndarray) -> int:
        """Position (into ``state.sel``) of the chosen candidate."""
        raise NotImplementedError


P = TypeVar("P", bound=type[Plugin])


# --------------------------------------------------------------------------- registry


class Registry:
    """Plugin types by extension point and registered name."""

    def __init__(self) -> None:
        self._types: dict[Kind, dict[str, type[Plugin]]] = {k: {} for k in Kind}

    def register(self, type_name: str) -> Callable[[P], P]:
        def deco(cls: P) -> P:
            table = self._types[cls.kind]
            if type_name in table and table[type_name] is not cls:
                raise ValueError(f"{cls.kind} plugin type {type_name!r} is registered twice")
            cls.type_name = type_name
            table[type_name] = cls
            return cls

        return deco

    def types(self, kind: Kind) -> dict[str, type[Plugin]]:
        return dict(self._types[kind])

    def get(self, kind: Kind, type_name: str) -> type[Plugin]:
        cls = self._types[kind].get(type_name)
        if cls is None:
            known = ", ".join(sorted(self._types[kind])) or "(none)"
            raise ConfigError(f"scheduler {kind} {type_name!r}: no such plugin type; known {kind}s: {known}")
        return cls

    def build(self, kind: Kind, spec: Any, *, policy: str = "custom") -> Plugin:
        """Build a plugin from a ``PluginConfig`` (or a mapping with type/weight/params/name,
        or just a type name). Every error is a ``ConfigError`` that names the plugin."""
        if isinstance(spec, str):
            type_name, weight, params, name = spec, 1.0, {}, None
        elif isinstance(spec, Mapping):
            type_name = spec.get("type", "")
            weight = spec.get("weight", 1.0)
            params = dict(spec.get("params") or {})
            name = spec.get("name")
        else:
            type_name = getattr(spec, "type", "")
            weight = getattr(spec, "weight", 1.0)
            params = dict(getattr(spec, "params", None) or {})
            name = getattr(spec, "name", None)
        cls = self.get(kind, str(type_name))
        where = f"scheduler {kind} {type_name!r}"
        try:
            weight = float(weight)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: weight {weight!r} is not a number") from None
        if weight < 0 or not math.isfinite(weight):
            raise ConfigError(f"{where}: weight must be a finite number >= 0, got {weight}")
        p = build_params(cls.Params, params, where)
        try:
            return cls(p, name=name, weight=weight, policy=policy)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def describe(self) -> list[dict[str, Any]]:
        """Every registered plugin with its parameters (for docs and ``--help`` output)."""
        out = []
        for kind in Kind:
            for type_name, cls in sorted(self._types[kind].items()):
                fields = []
                for f in dataclasses.fields(cls.Params):
                    default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc,operator]
                    fields.append({"name": f.name, "default": default, "doc": f.metadata.get("doc", "")})
                out.append({"kind": str(kind), "type": type_name, "doc": (cls.__doc__ or "").strip(), "params": fields})
        return out


REGISTRY = Registry()
register = REGISTRY.register

_SCALARS = (bool, int, float, str)


def _check_type(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_check_type(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (list, tuple, set, frozenset):
        return isinstance(value, list | tuple | set | frozenset)
    if origin is dict:
        return isinstance(value, Mapping)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def build_params(cls: type, params: Mapping[str, Any], where: str) -> Any:
    """Validate ``params`` against the ``Params`` dataclass ``cls``."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields)) or "none"
        raise ConfigError(f"{where}: unknown parameter(s) {', '.join(unknown)}; known: {known}")
    hints = typing.get_type_hints(cls)
    for key, value in params.items():
        hint = hints.get(key, Any)
        if not _check_type(value, hint):
            raise ConfigError(f"{where}: parameter {key}={value!r} should be {getattr(hint, '__name__', hint)}")
    try:
        obj = cls(**params)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    check = getattr(obj, "validate", None)
    if check is not None:
        try:
            check()
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    for k, h in hints.items():
        if h is float and isinstance(getattr(obj, k), int):
            setattr(obj, k, float(getattr(obj, k)))
    return obj


# --------------------------------------------------------------------------- cycle state


class CycleState:
    """Everything one decision computes once and its plugins share.

    The pool is the table rows serving the call's model (``rows``); arrays are over the
    pool, and ``sel`` holds the pool positions of the candidates still in play. Plugins read
    candidate values with ``state.c(array)``.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        request: CallRequest,
        table: ReplicaTable,
        rows: np.ndarray,
        now_s: float,
        model: str,
    ) -> None:
        self.scheduler = scheduler
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
        self.sel = _everyone(n)
        self._all = True  # sel is the whole pool
        self.rng = scheduler.rng
        self._matched: dict[str, np.ndarray] = {}
        self._speed: np.ndarray | None = None
        self._fastest: float | None = None
        self._prediction: Prediction | None = None
        self._saturated: np.ndarray | None = None
        self._room: np.ndarray | bool | None = False  # False: not computed yet
        self._needed: np.ndarray | None = None
        self._pinned = -2  # -2: not looked up yet
        self.pinned_name: str | None = None
        self.completion_tokens = scheduler.latency.expected_completion_tokens(model, request.max_tokens)
        self.saturation_waiting = scheduler.saturation_waiting

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
                index = self.scheduler.kv_index
                ids = self.table.ids_for(index.slots)
                ids = ids[self._start : self._start + self.n] if self._start >= 0 else ids[self.rows]
                arr = index.match_ids(
                    req.block_hashes, ids, source=source, block_size=req.block_size, tokenized=req.tokenized
                ).astype(np.float64)
            else:
                arr = np.zeros(self.n)
            self._matched[source] = arr
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
        avg_prompt = self.scheduler.latency.expected_prompt_tokens(self.model)
        return np.maximum(self.inflight_prefill, self.waiting * avg_prompt)

    @property
    def prediction(self) -> Prediction:
        """Predicted queue, prefill, decode, TTFT and total milliseconds per pool replica."""
        if self._prediction is None:
            lat = self.scheduler.latency
            gpus = self.table.gpus
            # a fleet (or cell) of one GPU generation: its parameters as scalars
            params = lat.gpu_row(gpus[0]) if len(gpus) == 1 else lat.gpu_params(gpus)[self.gpu_codes]
            self._prediction = lat.predict(
                params=params,
                uncached_tokens=self.uncached_tokens(),
                queued_tokens=self.queued_tokens,
                running=self.running,
                loaded=self.loaded,
                completion_tokens=self.completion_tokens,
            )
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
            sat = (
                (self.waiting >= self.saturation_waiting)
                | (self.running >= self.max_seqs)
                | (self.free < self.new_blocks_needed())
            )
            room = self.room
            self._saturated = sat if room is None else sat | ~room
        return self._saturated

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
            limit = working_set_limit(self)
            pins = self.scheduler.sessions
            if limit is not None and pins is not None:
                pins.sweep(self.now_s)
                ws = pins.working_sets_of_rows(self.table, self.rows)
                need = self.request.prompt_tokens + self.completion_tokens
                self._room = ws + need <= limit * self.total * self.block_size
        return self._room  # type: ignore[return-value]

    @property
    def pinned(self) -> int:
        """Pool position of the session's live pin, or -1."""
        if self._pinned == -2:
            self._pinned = -1
            req = self.request
            session = req.session_id or req.task_id
            pins = self.scheduler.sessions
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


def working_set_limit(state: CycleState | OneCandidate) -> float | None:
    """The share of a replica's KV cache a task's first call may fill with pinned contexts,
    or None when working-set admission does not apply to this call (``starts_task`` is
    read last: it may look the session's pin up, which can expire it)."""
    settings = state.scheduler.admission
    if settings is None or state.scheduler.sessions is None or not settings.working_set_limits:
        return None
    if not state.starts_task:
        return None
    budget = state.request.budget_ms
    if budget is not None and budget < (
        settings.working_set_min_budget_retries * settings.working_set_retry_after_s * 1000.0
    ):
        return None  # too short a budget to wait out a refusal
    return settings.working_set_limits.get(state.request.priority)


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
        "_matched", "_needed", "_prediction", "_room", "_room_known", "_saturated", "_state", "block_size",
        "completion_tokens", "free", "healthy", "inflight_prefill", "loaded", "max_seqs", "model", "now_s", "request",
        "row", "running", "scheduler", "table", "total", "view", "waiting",
    )

    def __init__(self, scheduler: Scheduler, request: CallRequest, table: ReplicaTable, row: int, now_s: float) -> None:
        self.scheduler = scheduler
        self.request = request
        self.table = table
        self.row = row
        self.now_s = now_s
        self.model = request.model
        self.view = table.views[row]
        free, total, running, waiting, prefill, _, _, max_seqs, block_size, healthy, loaded, _ = table.cols[row].tolist()
        self.free = free
        self.total = max(total, 1.0)
        self.running = running
        self.waiting = waiting
        self.inflight_prefill = prefill
        self.max_seqs = max(max_seqs, 1.0)
        self.block_size = max(block_size, 1.0)
        self.healthy = healthy > 0
        self.loaded = loaded > 0
        self.completion_tokens = scheduler.latency.expected_completion_tokens(self.model, request.max_tokens)
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
            self._state = CycleState(self.scheduler, self.request, self.table, rows, self.now_s, self.model)
            self._state._pinned, self._state.pinned_name = 0, self.view.name  # the session's pin
        return self._state

    def matched(self) -> float:
        """Leading prompt blocks the replica holds (``CycleState.matched("auto")``)."""
        if self._matched is None:
            req = self.request
            self._matched = 0.0
            if req.block_hashes:
                index = self.scheduler.kv_index
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
            lat = self.scheduler.latency
            queued = max(self.inflight_prefill, self.waiting * lat.expected_prompt_tokens(self.model))
            self._prediction = lat.predict_scalar(
                lat.gpu_row(self.view.gpu),
                uncached_tokens=self.uncached_tokens(),
                queued_tokens=queued,
                running=self.running,
                loaded=self.loaded,
                completion_tokens=self.completion_tokens,
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
            limit = working_set_limit(self)
            pins = self.scheduler.sessions
            if limit is not None and pins is not None:
                pins.sweep(self.now_s)
                ws = pins.working_set_of_row(self.table, self.row)
                need = self.request.prompt_tokens + self.completion_tokens
                self._room = ws + need <= limit * self.total * self.block_size
        return self._room

    @property
    def saturated(self) -> bool:
        """``CycleState.saturated`` for the one replica."""
        if self._saturated is None:
            needed = self.new_blocks_needed()
            room = self.room
            sat = self.waiting >= self.scheduler.saturation_waiting or self.running >= self.max_seqs or self.free < needed
            self._saturated = sat or room is False
        return self._saturated


def any_true(mask: np.ndarray) -> bool:
    """``mask.any()``: the same answer at a fraction of the cost on a decision's arrays
    (``ndarray.any`` goes through a generic reduction; counting is a tight loop)."""
    return bool(np.count_nonzero(mask))


def keeps_all(ok: np.ndarray, soft: bool) -> bool:
    """Does a filter with pass mask ``ok`` keep every candidate: all pass, or (``soft``)
    none does? One count instead of a test here and another in ``Scheduler._filter``."""
    kept = np.count_nonzero(ok)
    return kept == len(ok) or (soft and not kept)


def minmax_low_is_better(values: np.ndarray) -> np.ndarray:
    """llm-d style normalisation: (max - v) / (max - min); all equal -> all 1."""
    if values.size == 0:
        return values
    lo = float(values.min())
    hi = float(values.max())
    if hi - lo <= 1e-12:
        return np.ones_like(values)
    return (hi - values) / (hi - lo)


def ratio_low_is_better(values: np.ndarray, floor: float = 1e-9, lowest: float | None = None) -> np.ndarray:
    """min / v: 1 for the best candidate, proportionally less for worse ones.

    Unlike min-max this does not blow a 1 % difference up to the full [0, 1] range.
    ``lowest``: ``values.min()``, when the caller has it already (the same result: the
    smallest of the floored values is the floored smallest value).
    """
    if values.size == 0:
        return values
    v = np.maximum(values, floor)
    best = v.min() if lowest is None else max(lowest, floor)
    return best / v
