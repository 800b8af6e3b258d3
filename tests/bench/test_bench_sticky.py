"""Sticky sessions (the scheduler change the 1,000-replica benchmark led to): a call whose
session has a live pin is decided over its pinned replica alone while that replica can take
it, and through the whole pool when it cannot."""

from __future__ import annotations

from taskplane.scheduler.policies import build_policy
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.types import Action, CallOutcome, CallRequest, ReplicaView

BS = 16


def _fleet(n: int) -> ReplicaTable:
    return ReplicaTable([ReplicaView(name=f"r{i:04d}", model="m", gpu="h100", cost_per_hour_usd=2.5,
                                     kv_blocks_total=10_000, kv_blocks_free=10_000, block_size=BS)
                         for i in range(n)])


def _call(step: int, session: str = "s") -> CallRequest:
    return CallRequest(model="m", prompt_tokens=400 + 100 * step, max_tokens=50, session_id=session,
                       task_id=session, step=step, steps_remaining=5 - step, call_id=f"{session}:{step}",
                       block_size=BS, agent="a")


def test_pinned_session_stays_and_moves_only_when_its_replica_cannot_take_it() -> None:
    sched = build_policy("taskplane", seed=1, metrics=False)
    assert sched.pipeline.sticky
    table = _fleet(200)
    first = sched.decide(_call(0), table, 0.0)
    assert first.action == Action.PLACE
    home = first.replica or ""
    sched.observe_completion(_call(0), CallOutcome(replica=home, completion_tokens=50), 1.0)
    # the home replica gets busier than every other one, but can still take the call
    table.update(home, num_running=30)
    again = sched.decide(_call(1), table, 2.0)
    assert again.action == Action.PLACE and again.replica == home and not again.session_moved
    sched.observe_completion(_call(1), CallOutcome(replica=home, completion_tokens=50), 3.0)
    # saturated (engine queue at the admission limit): the whole pool decides, the session moves
    table.update(home, num_waiting=5)
    moved = sched.decide(_call(2), table, 4.0)
    assert moved.action == Action.PLACE and moved.replica != home and moved.session_moved


def test_sticky_and_full_decisions_agree_on_an_idle_fleet() -> None:
    a = build_policy("taskplane", seed=3, metrics=False)
    b = build_policy("taskplane", seed=3, metrics=False)
    b.sticky = False
    table = _fleet(50)
    for step in range(5):
        da = a.decide(_call(step), table, float(step))
        db = b.decide(_call(step), table, float(step))
        assert (da.action, da.replica) == (db.action, db.replica)
        for sched, d in ((a, da), (b, db)):
            sched.observe_completion(_call(step), CallOutcome(replica=d.replica or "", completion_tokens=50),
                                     step + 0.5)
