"""Session pins: keep an agent's conversation on the replica that holds its KV cache.

Between two calls of a session the agent runs a tool (a test suite, a web search); the pin
must outlive that gap or the next call lands on a cold replica. How long a gap lasts depends
on the agent, so the time-to-live is learned per agent from the gaps actually observed:
mean + k standard deviations, clamped. Pins never expire while a call is in flight.

Each pin also carries the session's context size (prompt + completion tokens of its latest
call), summed per replica into the replica's *working set*: the KV cache the sessions in
flight there will come back for. Admission uses it to keep new tasks from evicting the
context of tasks already running (see ``AdmissionSettings.working_set_limits``). A
session whose last step finished (no steps remaining) is released at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from prometheus_client import Counter

from taskplane.scheduler.kv.slots import ReplicaSlots
from taskplane.scheduler.table import ReplicaTable

PINS_BROKEN = Counter(
    "taskplane_scheduler_pins_broken_total",
    "session pins broken (the session moved or lost its replica)",
    ["policy", "reason"],
)


@dataclass(slots=True)
class Pin:
    replica: str
    agent: str
    last_end_s: float | None  # when the session's last call finished (None: one in flight)
    inflight: int = 0
    tokens: int = 0  # context of the latest call (prompt + completion): its KV footprint
    calls: float = 1.0  # calls still to come, the latest included (1 + steps remaining; 1 if unknown)


class _GapStats:
    __slots__ = ("mean", "n", "var")

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.var = 0.0


class SessionPins:
    """Session -> replica pins with a TTL learned from each agent's tool-call gaps."""

    def __init__(
        self,
        *,
        default_ttl_s: float = 60.0,
        min_ttl_s: float = 5.0,
        max_ttl_s: float = 900.0,
        k_std: float = 2.0,
        alpha: float = 0.1,
        min_samples: int = 3,
        max_sessions: int = 1_000_000,
        policy: str = "taskplane",
        metrics: bool = True,
    ) -> None:
        self.default_ttl_s = default_ttl_s
        self.min_ttl_s = min_ttl_s
        self.max_ttl_s = max_ttl_s
        self.k_std = k_std
        self.alpha = alpha
        self.min_samples = min_samples
        self.max_sessions = max_sessions
        self.policy = policy
        self.metrics = metrics  # False: count broken pins in ``broken`` only, not in Prometheus
        self._pins: dict[str, Pin] = {}
        self._gaps: dict[str, _GapStats] = {}
        self.broken: dict[str, int] = {}
        self._broken_counters: dict[str, Counter] = {}  # reason -> its PINS_BROKEN child
        # tokens of the sessions pinned to each replica, by a small id per replica, so a
        # decision reads a whole pool's working sets with one gather (working_sets_of_rows)
        self._ws_ids = ReplicaSlots()
        self._ws_arr = np.zeros(64)  # the slot past the last id (unknown names) stays 0
        self._n_arr = np.zeros(64)  # calls still to come of the sessions pinned there, by the same ids
        # agent -> its idle sessions (no call in flight) in the order they went idle, so a
        # sweep expires a prefix per agent instead of scanning every pin
        self._idle: dict[str, dict[str, None]] = {}
        self._swept_s = -math.inf

    def __len__(self) -> int:
        return len(self._pins)

    # -- TTL learning

    def ttl_for(self, agent: str | None) -> float:
        stats = self._gaps.get(agent or "default")
        if stats is None or stats.n < self.min_samples:
            return self.default_ttl_s
        ttl = stats.mean + self.k_std * math.sqrt(max(stats.var, 0.0))
        return min(max(ttl, self.min_ttl_s), self.max_ttl_s)

    def observe_gap(self, agent: str | None, gap_s: float) -> None:
        if gap_s < 0:
            return
        key = agent or "default"
        stats = self._gaps.get(key)
        if stats is None:  # (not setdefault: that builds a _GapStats on every call)
            stats = self._gaps[key] = _GapStats()
        stats.n += 1
        if stats.n == 1:
            stats.mean, stats.var = gap_s, 0.0
            return
        a = max(self.alpha, 1.0 / stats.n)  # plain average until alpha takes over
        delta = gap_s - stats.mean
        stats.mean += a * delta
        stats.var = (1 - a) * (stats.var + a * delta * delta)

    # -- pins

    def get(self, session: str | None, now_s: float) -> str | None:
        """The replica ``session`` is pinned to, if the pin is still alive."""
        if session is None:
            return None
        pin = self._pins.get(session)
        if pin is None:
            return None
        if pin.inflight == 0 and pin.last_end_s is not None:
            if now_s - pin.last_end_s > self.ttl_for(pin.agent):
                self._drop(session, pin)
                self._count("expired")
                return None
        return pin.replica

    def placed(
        self,
        session: str | None,
        replica: str,
        now_s: float,
        agent: str | None = None,
        tokens: int = 0,
        calls: float = 1.0,
    ) -> None:
        """A call of ``session`` was placed on ``replica``: (re)pin it and learn the gap.

        ``tokens``: the call's prompt + expected completion, the session's KV footprint now;
        ``calls``: this call and the steps still to come (the work the pin brings its replica).
        """
        if session is None:
            return
        pin = self._pins.get(session)
        if pin is not None and pin.inflight == 0 and pin.last_end_s is not None:
            self.observe_gap(pin.agent, now_s - pin.last_end_s)
        if pin is None:
            if len(self._pins) >= self.max_sessions:
                self._evict_oldest()
            pin = self._pins[session] = Pin(replica, agent or "default", None, 0)
        else:
            self._ws_add(pin.replica, -pin.tokens, -pin.calls)
            self._not_idle(session, pin)
        pin.replica = replica
        if agent:
            pin.agent = agent
        pin.inflight += 1
        pin.last_end_s = None
        pin.tokens = max(int(tokens), 0)
        pin.calls = max(float(calls), 1.0)
        self._ws_add(replica, pin.tokens, pin.calls)

    def end(self, session: str | None) -> bool:
        """The session's task is done (its last step finished): release its pin now."""
        if session is None:
            return False
        pin = self._pins.get(session)
        if pin is None:
            return False
        self._drop(session, pin)
        return True

    # -- working sets

    def _ws_add(self, replica: str, tokens: int, calls: float = 0.0) -> None:
        if tokens or calls:
            rid = self._ws_ids.ensure(replica)
            if rid + 1 >= len(self._ws_arr):
                self._ws_arr = np.concatenate([self._ws_arr, np.zeros(len(self._ws_arr))])
                self._n_arr = np.concatenate([self._n_arr, np.zeros(len(self._n_arr))])
            arr = self._ws_arr
            arr[rid] = max(arr.item(rid) + tokens, 0.0)  # a Python float: no numpy scalar arithmetic
            if calls:
                n = self._n_arr
                n[rid] = max(n.item(rid) + calls, 0.0)

    def _drop(self, session: str, pin: Pin) -> None:
        del self._pins[session]
        self._ws_add(pin.replica, -pin.tokens, -pin.calls)
        self._not_idle(session, pin)

    def _not_idle(self, session: str, pin: Pin) -> None:
        idle = self._idle.get(pin.agent)
        if idle is not None:
            idle.pop(session, None)

    def sweep(self, now_s: float, every_s: float = 1.0) -> None:
        """Expire idle pins past their TTL (at most once per ``every_s``), so working sets
        do not count sessions that have gone away."""
        if now_s - self._swept_s < every_s:
            return
        self._swept_s = now_s
        for agent, idle in self._idle.items():
            # idle in the order their last call ended: the expired ones are a prefix
            ttl = self.ttl_for(agent)
            while idle:
                session = next(iter(idle))
                pin = self._pins[session]
                if pin.last_end_s is None or now_s - pin.last_end_s <= ttl:
                    break
                self._drop(session, pin)
                self._count("expired")

    def working_set(self, replica: str) -> int:
        """Context tokens of the sessions pinned to ``replica`` (call ``sweep`` first)."""
        rid = self._ws_ids.get(replica)
        return 0 if rid is None else int(self._ws_arr[rid])

    def working_sets(self, replicas: Sequence[str]) -> np.ndarray:
        """``working_set`` of each of ``replicas``, as floats."""
        return self._ws_arr[self._ws_ids.ids_of(replicas)]

    def working_sets_of_rows(self, table: ReplicaTable, rows: np.ndarray) -> np.ndarray:
        """``working_sets`` of the replicas at ``rows`` of ``table``: one gather through an
        id map the table caches until either side's membership changes."""
        return self._ws_arr[table.ids_for(self._ws_ids)[rows]]

    def work_of_rows(self, table: ReplicaTable, rows: np.ndarray) -> np.ndarray:
        """Calls still to come of the sessions pinned to each replica at ``rows`` of
        ``table`` (call ``sweep`` first): the work those pins will bring back."""
        return self._n_arr[table.ids_for(self._ws_ids)[rows]]

    def working_set_of_row(self, table: ReplicaTable, row: int) -> float:
        """``working_sets_of_rows`` for one row, as a float."""
        return float(self._ws_arr[table.ids_for(self._ws_ids)[row]])

    def finished(self, session: str | None, now_s: float) -> None:
        """A call of ``session`` finished: the tool-call gap starts now."""
        if session is None:
            return
        pin = self._pins.get(session)
        if pin is None:
            return
        pin.inflight = max(pin.inflight - 1, 0)
        pin.last_end_s = now_s
        if pin.inflight == 0:
            idle = self._idle.get(pin.agent)
            if idle is None:  # (not setdefault: that builds a dict on every call)
                idle = self._idle[pin.agent] = {}
            idle.pop(session, None)
            idle[session] = None  # the most recently idle goes last

    def break_pin(self, session: str, reason: str) -> bool:
        pin = self._pins.get(session)
        if pin is None:
            return False
        self._drop(session, pin)
        self._count(reason)
        return True

    def drop_replica(self, replica: str, reason: str) -> int:
        """Break every pin to ``replica`` (it failed or left); returns how many."""
        victims = [s for s, p in self._pins.items() if p.replica == replica]
        for s in victims:
            self._not_idle(s, self._pins.pop(s))
        rid = self._ws_ids.get(replica)
        if rid is not None:
            self._ws_arr[rid] = self._n_arr[rid] = 0.0
        if victims:
            self._count(reason, len(victims))
        return len(victims)

    def _evict_oldest(self) -> None:
        # dicts keep insertion order: the first pin is the oldest session still tracked
        for session, pin in self._pins.items():
            self._drop(session, pin)
            return

    def _count(self, reason: str, n: int = 1) -> None:
        self.broken[reason] = self.broken.get(reason, 0) + n
        if self.metrics:
            child = self._broken_counters.get(reason)
            if child is None:
                child = self._broken_counters[reason] = PINS_BROKEN.labels(self.policy, reason)
            child.inc(n)
