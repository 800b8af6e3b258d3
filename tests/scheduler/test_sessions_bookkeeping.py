"""Session pins' bookkeeping kept for speed agrees with the plain definitions: the
working-set array read by a pool gather equals the per-replica sums, and the idle-order
sweep expires exactly the pins past their agent's TTL."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from taskplane.scheduler.sessions import SessionPins
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.types import ReplicaView

REPLICAS = [f"r{i}" for i in range(6)]
OPS = st.lists(
    st.tuples(st.sampled_from(["place", "finish", "end", "break", "drop", "sweep"]),
              st.integers(0, 5), st.integers(0, 5), st.integers(0, 3000), st.floats(0.5, 8.0)),
    max_size=80,
)


def _table() -> ReplicaTable:
    return ReplicaTable([ReplicaView(name=n, model="m", gpu="h100", cost_per_hour_usd=2.0) for n in reversed(REPLICAS)])


def _expected_ws(pins: SessionPins, names: list[str]) -> list[float]:
    live = pins._pins
    return [float(sum(p.tokens for p in live.values() if p.replica == n)) for n in names]


@settings(max_examples=400, deadline=None)
@given(OPS, st.integers(0, 2**31))
def test_working_sets_and_sweep_match_their_definitions(ops: list[tuple[str, int, int, int, float]], seed: int) -> None:
    rng = random.Random(seed)
    pins = SessionPins(default_ttl_s=10.0, min_samples=2)
    table = _table()
    rows = np.arange(len(table))
    now = 0.0
    for op, s, r, tokens, dt in ops:
        now += dt
        session, replica = f"s{s}", REPLICAS[r]
        agent = "a" if s % 3 else rng.choice(["a", "b"])  # mostly one agent: long idle queues
        if op == "place":
            pins.placed(session, replica, now, agent, tokens=tokens)
        elif op == "finish":
            pins.finished(session, now)
        elif op == "end":
            pins.end(session)
        elif op == "break":
            pins.break_pin(session, "failed")
        elif op == "drop":
            pins.drop_replica(replica, "removed")
        else:
            before = {k: (p.inflight, p.last_end_s, p.agent) for k, p in pins._pins.items()}
            pins.sweep(now, every_s=0.0)
            expired = {k for k, (inflight, end, ag) in before.items()
                       if inflight == 0 and end is not None and now - end > pins.ttl_for(ag)}
            assert set(pins._pins) == set(before) - expired
        names = table.names
        assert pins.working_sets_of_rows(table, rows).tolist() == _expected_ws(pins, names)
        assert pins.working_sets(names).tolist() == _expected_ws(pins, names)


def test_a_session_called_again_leaves_the_idle_order() -> None:
    """A pin that goes busy again must not hold back the expiry of the pins idle behind it."""
    pins = SessionPins(default_ttl_s=10.0)
    pins.placed("s1", "r0", 0.0, "a", tokens=100)
    pins.finished("s1", 1.0)
    pins.placed("s2", "r1", 2.0, "a", tokens=200)
    pins.finished("s2", 3.0)
    pins.placed("s1", "r0", 4.0, "a", tokens=300)  # s1 busy again (in flight)
    pins.sweep(20.0, every_s=0.0)  # s2 idle for 17 s > 10 s: expired; s1 is in flight
    assert set(pins._pins) == {"s1"}
    assert pins.working_sets(["r0", "r1"]).tolist() == [300.0, 0.0]
