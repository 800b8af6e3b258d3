"""Working-set admission (the scheduler change the agent benchmark led to): a task's first
call is refused while no replica has KV room for it next to the sessions in flight, later
steps of tasks in flight always go ahead, and a finished task gives its room back."""

from __future__ import annotations

from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.scheduler.policies import build_policy
from taskplane.scheduler.sessions import SessionPins
from taskplane.scheduler.types import Action, CallOutcome, CallRequest, ReplicaView

BS = 16


def _fleet() -> list[ReplicaView]:
    # 100 blocks of 16 tokens: 1,600 tokens of KV each
    return [ReplicaView(name=f"r{i}", model="m", gpu="h100", cost_per_hour_usd=2.5, kv_blocks_total=100,
                        kv_blocks_free=100, block_size=BS, has_kv_events=False) for i in range(2)]


def _call(task: str, step: int, remaining: int, tokens: int = 900, priority: str = "standard") -> CallRequest:
    return CallRequest(model="m", prompt_tokens=tokens, max_tokens=100, tenant="t", priority=priority,
                       session_id=task, task_id=task, step=step, steps_remaining=remaining,
                       call_id=f"{task}:{step}", block_size=BS, agent="a")


def test_session_pins_sum_context_per_replica() -> None:
    pins = SessionPins(default_ttl_s=10.0)
    pins.placed("a", "r0", 0.0, "x", tokens=500)
    pins.placed("b", "r0", 0.0, "x", tokens=300)
    pins.placed("c", "r1", 0.0, "x", tokens=200)
    assert (pins.working_set("r0"), pins.working_set("r1")) == (800, 200)
    pins.finished("a", 1.0)
    pins.placed("a", "r0", 2.0, "x", tokens=700)  # the context grew
    assert pins.working_set("r0") == 1000
    pins.placed("b", "r1", 2.0, "x", tokens=350)  # the session moved
    assert (pins.working_set("r0"), pins.working_set("r1")) == (700, 550)
    assert pins.end("c") and pins.working_set("r1") == 350
    pins.finished("a", 3.0)
    pins.sweep(3.0 + 10.5)  # idle past its TTL: expired
    assert pins.working_set("r0") == 0 and pins.get("a", 14.0) is None
    pins.drop_replica("r1", "failed")
    assert pins.working_set("r1") == 0 and len(pins) == 0


def test_new_tasks_wait_for_room_while_tasks_in_flight_go_ahead() -> None:
    sched = build_policy("taskplane", seed=1, metrics=False)
    assert sched.admission is not None and sched.admission.working_set_limits["standard"] == 0.75
    fleet = _fleet()
    # a standard task may fill 75 % of 1,600 tokens: one 900 + 100 token task per replica
    a = sched.decide(_call("A", 0, 2), fleet, 0.0)
    b = sched.decide(_call("B", 0, 2), fleet, 0.0)
    assert a.action == b.action == Action.PLACE and {a.replica, b.replica} == {"r0", "r1"}
    for req, d in ((_call("A", 0, 2), a), (_call("B", 0, 2), b)):
        sched.observe_completion(req, CallOutcome(replica=d.replica or "", completion_tokens=100), 1.0)

    c = sched.decide(_call("C", 0, 2), fleet, 1.5)
    assert c.action == Action.SHED and c.retry_after_s == 30.0 and "KV room" in c.reason

    # a later step of A goes ahead on its own replica although C was refused
    a1 = sched.decide(_call("A", 1, 0, tokens=1000), fleet, 2.0)
    assert a1.action == Action.PLACE and a1.replica == a.replica
    # A's last step ends: its room is free, so C gets in there
    sched.observe_completion(_call("A", 1, 0, tokens=1000), CallOutcome(replica=a.replica or ""), 3.0)
    c2 = sched.decide(_call("C", 0, 2), fleet, 3.5)
    assert c2.action == Action.PLACE and c2.replica == a.replica


def test_bands_give_way_in_order_and_an_empty_limit_turns_it_off() -> None:
    sched = build_policy("taskplane", seed=1, metrics=False)
    fleet = _fleet()
    # 1,000 tokens of context pinned on each replica: 62.5 % of 1,600
    for t in ("A", "B"):
        sched.decide(_call(t, 0, 3), fleet, 0.0)
    # + 200 tokens -> 75 %: over batch's 70 %, within standard's 75 %
    assert sched.decide(_call("Z", 0, 2, tokens=100, priority="batch"), fleet, 1.0).action == Action.SHED
    assert sched.decide(_call("S", 0, 2, tokens=100), fleet, 1.0).action == Action.PLACE
    # that replica now holds 1,200 tokens: 1,400 would be 87.5 %, over interactive's 80 %
    # there but not on the other (75 %)
    d = sched.decide(_call("I", 0, 2, tokens=100, priority="interactive"), fleet, 1.0)
    assert d.action == Action.PLACE

    off = build_policy("taskplane", seed=1, metrics=False, admission=AdmissionSettings(working_set_limits={}))
    for t in ("A", "B", "C", "D"):
        assert off.decide(_call(t, 0, 2), fleet, 0.0).action == Action.PLACE
