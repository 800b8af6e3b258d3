"""Flow control holds a call only where the hold pays: its expected wait below the slowdown
its admission would cause the others (the latency model's prefill rate times the calls that
share the replica), never longer than that, and never for working-set room while the
fleet's queues are short. ``FIXED`` is the rule as a plain timed hold, what flow control did
before holds were priced: the same calls are held there, which is what these tests change."""

from __future__ import annotations

import pytest
from _sched_util import replica, request, tokens

from taskplane.errors import ConfigError
from taskplane.scheduler import Action, CallOutcome, build_policy
from taskplane.scheduler.flowcontrol.controller import FlowControl
from taskplane.scheduler.flowcontrol.flowset import build_flow
from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.scheduler.policies import scheduler_from_config
from taskplane.scheduler.types import CallRequest, ReplicaView

BS = 16
FIXED = AdmissionSettings(hold_pays=False, working_set_short_queue_ms=None)  # the default
PAYS = AdmissionSettings(hold_pays=True, working_set_short_queue_ms=500.0)


def _view(name: str = "r0", *, running: int = 0, waiting: int = 0, inflight: int = 0) -> ReplicaView:
    """1,600 tokens of KV: one 1,000-token task in flight leaves no room for a second."""
    return ReplicaView(name=name, model="m", gpu="h100", cost_per_hour_usd=2.5, kv_blocks_total=100,
                       kv_blocks_free=100, block_size=BS, has_kv_events=False, num_running=running,
                       num_waiting=waiting, inflight_prefill_tokens=inflight)


def _first(task: str) -> CallRequest:  # no budget: the working-set rule applies
    return CallRequest(model="m", prompt_tokens=900, max_tokens=100, tenant="t", session_id=task, task_id=task,
                       step=0, steps_remaining=2, call_id=f"{task}:0", block_size=BS, agent="a")


def _second_task(settings: AdmissionSettings | None, fleet: list[ReplicaView]) -> tuple[FlowControl, Action]:
    """Task A is in flight (its context pinned to r0); what happens to task B's first call?"""
    sched = build_policy("taskplane", seed=1, metrics=False, admission=settings)
    d = sched.decide(_first("A"), [_view()], 0.0)
    assert d.action is Action.PLACE
    sched.observe_completion(_first("A"), CallOutcome(replica="r0", completion_tokens=100), 1.0)
    return sched, sched.decide(_first("B"), fleet, 1.5).action


def test_a_first_call_is_not_held_for_room_while_the_fleet_queues_are_short() -> None:
    # the live symptom: an idle fleet, a session's first call held for working-set room
    assert _second_task(FIXED, [_view()])[1] is Action.QUEUE
    assert _second_task(PAYS, [_view()])[1] is Action.PLACE
    # short means no engine queue and little queued prefill: 200 ms of it is still short
    assert _second_task(PAYS, [_view(inflight=2400)])[1] is Action.PLACE


def test_a_room_hold_lasts_no_longer_than_the_slowdown_it_spares() -> None:
    # 30 calls share r0 and one waits: admitting B pushes 800 pinned tokens (~67 ms of
    # prefill at the H100 prior) out, which costs the 31 of them ~2.1 s in all
    busy = [_view(running=30, waiting=1)]
    sched, action = _second_task(PAYS, busy)
    assert action is Action.QUEUE  # its expected wait (~0.05 s) is well below that
    assert sched.release(busy, 2.5) == []  # held 1 s: within the cap
    out = sched.release(busy, 3.7)  # held 2.2 s: admitted past the rule
    assert [(r.task_id, d.action, d.replica) for r, d in out] == [("B", Action.PLACE, "r0")]
    fixed, action = _second_task(FIXED, busy)  # the timed hold keeps it for 30 s, then refuses
    assert action is Action.QUEUE and fixed.release(busy, 3.7) == []
    assert [d.action for _, d in fixed.release(busy, 31.6)] == [Action.SHED]


def test_a_first_call_whose_wait_exceeds_what_the_hold_spares_is_admitted() -> None:
    # one waiting call and nothing running: the eviction costs ~67 ms, the wait ~1 s
    one = [_view(waiting=1)]
    assert _second_task(FIXED, one)[1] is Action.QUEUE
    assert _second_task(PAYS, one)[1] is Action.PLACE


DEEP = 24_000  # ~2 s of queued prefill at the H100 prior


def test_late_binding_holds_only_what_pays_and_no_longer() -> None:
    deep = [replica("r0", inflight_prefill_tokens=DEEP), replica("r1", inflight_prefill_tokens=DEEP)]
    small = request(call_id="small")  # 64 tokens: ~5 ms of prefill, against a ~1 s wait
    assert build_policy("taskplane", metrics=False, admission=FIXED).decide(small, deep, 0.0).action is Action.QUEUE
    assert build_policy("taskplane", metrics=False, admission=PAYS).decide(small, deep, 0.0).action is Action.PLACE
    # 4,096 tokens next to 30 running calls each: ~10 s of slowdown against a ~1 s wait
    crowded = [replica("r0", inflight_prefill_tokens=DEEP, num_running=30),
               replica("r1", inflight_prefill_tokens=DEEP, num_running=30)]
    big = request(tokens(3, 256), call_id="big")
    s = build_policy("taskplane", metrics=False, admission=PAYS)
    assert s.decide(big, crowded, 0.0).action is Action.QUEUE
    assert s.release(crowded, 5.0) == []  # the backlog has not drained: still held
    out = s.release(crowded, 10.5)  # past ~10.2 s: placed although no replica drained
    assert [(r.call_id, d.action) for r, d in out] == [("big", Action.PLACE)]


def test_flow_control_plugins_from_yaml_config() -> None:
    s = scheduler_from_config({"policy": "taskplane", "flow_control": [
        {"type": "working-set-room", "params": {"hold_s": 5, "short_queue_ms": None}},
        {"type": "prefill-backlog", "params": {"max_prefill_backlog_ms": None}},
    ]})
    assert s.admission is not None
    assert s.admission.working_set_hold_s == 5.0 and s.admission.working_set_short_queue_ms is None
    assert s.admission.max_prefill_backlog_ms is None and s.admission.max_queue == 4096  # the rest: preset's
    deep = [replica("r0", inflight_prefill_tokens=DEEP)]
    assert s.decide(request(tokens(3, 256), call_id="c"), deep, 0.0).action is Action.PLACE  # late binding off
    with pytest.raises(ConfigError, match=r"working-set-room.*hold"):
        scheduler_from_config({"policy": "taskplane", "flow_control": [
            {"type": "working-set-room", "params": {"hold": 5}}]})
    with pytest.raises(ConfigError, match="limits"):
        scheduler_from_config({"policy": "taskplane", "flow_control": [
            {"type": "working-set-room", "params": {"limits": {"standard": 1.5}}}]})
    with pytest.raises(ConfigError, match="two plugins for role 'room'"):
        scheduler_from_config({"policy": "taskplane", "flow_control": [
            {"type": "working-set-room"}, {"type": "working-set-room"}]})
    with pytest.raises(ConfigError, match="no such plugin type"):
        scheduler_from_config({"policy": "taskplane", "flow_control": [{"type": "leaky-bucket"}]})
    # a baseline never gains flow control
    assert scheduler_from_config({"policy": "round-robin", "flow_control": [{"type": "shed"}]}).admission is None


def test_settings_and_plugins_are_one_configuration() -> None:
    odd = AdmissionSettings(max_queue=7, shed_bands=("batch",), fair_unit="calls", working_set_hold_s=3.0,
                            working_set_limits={"batch": 0.5}, max_prefill_backlog_ms=None, serial_prefill=False,
                            serial_prefill_min_tokens=9, hold_pays=False, working_set_short_queue_ms=None)
    assert AdmissionSettings.from_plugins(build_flow(odd.plugin_specs()).plugins) == odd
    assert AdmissionSettings.from_plugins(build_flow(AdmissionSettings().plugin_specs()).plugins) == AdmissionSettings()


def _second_task_from_history(calls_per_task: list[int]) -> Action:
    """Task A in flight on r0; task B's first call comes with no hint, only the agent's history."""
    from dataclasses import replace

    from taskplane.scheduler.predict.model import TaskHistory

    sched = build_policy("taskplane", seed=1, metrics=False, admission=FIXED)
    sched.pipeline.handle.predictor.seed(TaskHistory("a", "t", calls=n) for n in calls_per_task)
    sched.decide(_first("A"), [_view()], 0.0)
    sched.observe_completion(_first("A"), CallOutcome(replica="r0", completion_tokens=100), 1.0)
    return sched.decide(replace(_first("B"), steps_remaining=None), [_view()], 1.5).action


def test_a_first_call_is_held_for_room_only_when_history_expects_a_later_call() -> None:
    # a chat agent whose conversations mostly end after one turn (0.3 later calls expected):
    # its next conversation has little later context to protect, so it is not held
    assert _second_task_from_history([1] * 7 + [2] * 3) is Action.PLACE
    # an agent whose tasks make three calls: two later calls expected, so the rule holds it
    assert _second_task_from_history([3] * 10) is Action.QUEUE
