"""The prefill gate (``AdmissionSettings.serial_prefill``): a placement on a replica with
prompt tokens in flight waits for them and is handed out, unchanged, once they are
prefilled; in the simulator the call that came first then gets its first token as on an
idle replica, and the held one about when it would have."""

from __future__ import annotations

from _sched_util import fleet, replica, request, tokens

from taskplane.scheduler import Action, CallOutcome, build_policy
from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.sim.cluster import ClusterSpec, simulate
from taskplane.sim.results import Outcome
from taskplane.sim.workloads.base import CallSpec, TaskSpec, Workload

GATE = AdmissionSettings(serial_prefill_min_replicas=1, serial_prefill_min_tokens=0)  # small fleets, tiny prompts


def pinned(s: object, session: str, convo: list[int]) -> str:
    """Place a session's first call on an idle fleet and end it: the session is pinned."""
    first = s.decide(request(convo, session_id=session, step=0, call_id=f"{session}0"), fleet(2), 0.0)  # type: ignore[attr-defined]
    assert first.action is Action.PLACE and first.replica
    s.observe_completion(request(convo, session_id=session, steps_remaining=3),  # type: ignore[attr-defined]
                         CallOutcome(replica=first.replica), now_s=1.0)
    return first.replica


def test_a_pinned_call_waits_for_the_prefill_in_flight_on_its_replica() -> None:
    s = build_policy("taskplane", metrics=False, admission=GATE)
    assert AdmissionSettings().serial_prefill
    convo = tokens(1, 4)
    home = pinned(s, "s", convo)
    other = "r1" if home == "r0" else "r0"
    busy = [replica(home, inflight_prefill_tokens=3_000), replica(other)]
    nxt = request(convo + tokens(1, 1, start=len(convo)), session_id="s", step=1, call_id="s1", steps_remaining=2)
    d = s.decide(nxt, busy, 2.0)
    assert d.action is Action.QUEUE and home in d.reason
    assert s.queued == 1 and s.pending and s.queue_depths()["m"]["standard"] == 1
    assert s.release(busy, 2.1) == []  # still in flight: nothing moves
    out = s.release([replica(home), replica(other)], 2.3)
    assert [(r.call_id, d.action, d.replica) for r, d in out] == [("s1", Action.PLACE, home)]
    assert s.queued == 0 and not s.pending


def test_a_prefill_that_never_clears_holds_its_line_at_most_the_bound() -> None:
    s = build_policy("taskplane", metrics=False, admission=GATE)
    assert GATE.serial_prefill_max_hold_ms == 2000.0
    convo = tokens(1, 4)
    home = pinned(s, "s", convo)
    stuck = [replica(home, inflight_prefill_tokens=3_000), replica("r1" if home == "r0" else "r0")]
    nxt = request(convo + tokens(1, 1, start=len(convo)), session_id="s", step=1, call_id="s1", steps_remaining=2)
    assert s.decide(nxt, stuck, 2.0).action is Action.QUEUE
    assert s.release(stuck, 3.9) == []  # held 1.9 s: still waits
    out = s.release(stuck, 4.0)  # held 2 s with the prefill still in flight: dispatched all the same
    assert [(r.call_id, d.action, d.replica) for r, d in out] == [("s1", Action.PLACE, home)]
    assert s.queued == 0


def test_a_call_with_little_to_prefill_is_not_held() -> None:
    """A hold costs the held call a turn of the live control loop: not worth it for a prefill
    shorter than ``serial_prefill_min_tokens``, which shares the engine's step cheaply."""
    floor = AdmissionSettings(serial_prefill_min_replicas=1)
    assert floor.serial_prefill_min_tokens == 128
    convo = tokens(1, 4)
    for new_blocks, held in ((1, False), (7, False), (8, True)):  # 16, 112 new tokens: placed; 128: held
        s = build_policy("taskplane", metrics=False, admission=floor)
        home = pinned(s, "s", convo)
        busy = [replica(home, inflight_prefill_tokens=3_000), replica("r1" if home == "r0" else "r0")]
        nxt = request(convo + tokens(1, new_blocks, start=len(convo)), session_id="s", step=1, call_id="s1", steps_remaining=2)
        d = s.decide(nxt, busy, 2.0)
        assert (d.action is Action.QUEUE) is held, (new_blocks, d)
        if not held:
            assert d.action is Action.PLACE and d.replica == home


def test_where_kv_events_tell_a_begun_prefill_holds_nobody() -> None:
    """The gateway's view says which prompts the replica has begun (its KV events): the gate
    waits for the unbegun ones only, and a held call goes once they have begun."""
    s = build_policy("taskplane", metrics=False, admission=GATE)
    convo = tokens(1, 4)
    home = pinned(s, "s", convo)
    other = "r1" if home == "r0" else "r0"
    nxt = request(convo + tokens(1, 1, start=len(convo)), session_id="s", step=1, call_id="s1", steps_remaining=2)
    begun = [replica(home, inflight_prefill_tokens=3_000, unstarted_prefill_tokens=0), replica(other)]
    assert s.decide(nxt, begun, 2.0).action is Action.PLACE
    s2 = build_policy("taskplane", metrics=False, admission=GATE)
    home2 = pinned(s2, "s", convo)
    other2 = "r1" if home2 == "r0" else "r0"
    waiting = [replica(home2, inflight_prefill_tokens=3_000, unstarted_prefill_tokens=3_000), replica(other2)]
    assert s2.decide(nxt, waiting, 2.0).action is Action.QUEUE
    out = s2.release([replica(home2, inflight_prefill_tokens=3_000, unstarted_prefill_tokens=0), replica(other2)], 2.1)
    assert [(r.call_id, d.replica) for r, d in out] == [("s1", home2)]


def test_a_pool_smaller_than_the_minimum_is_not_gated() -> None:
    s = build_policy("taskplane", metrics=False)
    assert AdmissionSettings().serial_prefill_min_replicas == 8
    d = s.decide(request(call_id="c"), [replica("r0", inflight_prefill_tokens=3_000)], 1.0)
    assert d.action is Action.PLACE


def test_without_the_gate_the_call_is_placed_at_once() -> None:
    s = build_policy("taskplane", metrics=False, admission=AdmissionSettings(serial_prefill=False))
    convo = tokens(1, 4)
    home = pinned(s, "s", convo)
    busy = [replica(home, inflight_prefill_tokens=3_000), replica("r1" if home == "r0" else "r0")]
    nxt = request(convo + tokens(1, 1, start=len(convo)), session_id="s", step=1, call_id="s1", steps_remaining=2)
    d = s.decide(nxt, busy, 2.0)
    assert d.action is Action.PLACE and d.replica == home


def test_one_line_per_replica_first_come_first_served_one_at_a_time() -> None:
    s = build_policy("taskplane", metrics=False, admission=GATE)
    homes = {}
    for name, k in (("a", 1), ("b", 2), ("c", 3)):
        homes[name] = pinned(s, name, tokens(k, 4))
    target = homes["a"]
    same = [n for n in ("a", "b", "c") if homes[n] == target]
    busy = [replica("r0", inflight_prefill_tokens=2_000), replica("r1", inflight_prefill_tokens=2_000)]
    for n in same:
        k = "abc".index(n) + 1
        d = s.decide(request(tokens(k, 5), session_id=n, step=1, call_id=f"{n}1", steps_remaining=2), busy, 2.0)
        assert d.action is Action.QUEUE
    idle = [replica("r0"), replica("r1")]
    out = s.release(idle, 2.5)  # the head goes; the replica has its prompt in flight then
    assert [r.call_id for r, _ in out] == [f"{same[0]}1"]
    s.cancel(out[0][0])  # (already handed out: nothing to cancel)
    rest = [r.call_id for r, _ in s.release(idle, 3.0)]
    assert rest == [f"{n}1" for n in same[1:2]]


def two_sessions_together(gate: bool) -> dict[str, float]:
    """TTFT (s) of two calls arriving together at one replica, each its session's only call."""
    calls = {"x": 4_000, "y": 2_000}  # prompt tokens: one step budget (8,192) holds both
    tasks = [TaskSpec(task_id=t, arrival_s=1.0, agent="trace", calls=[CallSpec(
        output_tokens=20, at_s=1.0, prompt_tokens=n, contents=[hash((t, j)) & 0xFFFFFFF for j in range(n // 16)])])
        for t, n in calls.items()]
    wl = Workload(name="two", tasks=tasks, block_size=16)
    s = build_policy("taskplane", seed=1, metrics=False,
                     admission=AdmissionSettings(serial_prefill=gate, serial_prefill_min_replicas=1))
    res = simulate(ClusterSpec.fleet("h100:1"), wl, s, seed=1)
    assert all(c.outcome is Outcome.SUCCESS for c in res.calls)
    return {c.task_id: c.first_token_s - c.offered_s for c in res.calls}  # type: ignore[operator]


def test_in_the_simulator_the_first_call_is_as_fast_as_alone_and_the_second_barely_slower() -> None:
    shared, held = two_sessions_together(False), two_sessions_together(True)
    first = min(held, key=held.get)  # type: ignore[arg-type]
    second = max(held, key=held.get)  # type: ignore[arg-type]
    # sharing a step, both wait for both prompts; held, the first waits for its own only
    assert abs(shared["x"] - shared["y"]) < 0.005
    assert held[first] < shared[first] * 0.75
    # the second ends its prefill at most a step or two later than in the shared step
    assert held[second] - shared[second] < 0.03


def test_a_more_urgent_call_leaves_the_line_first() -> None:
    s = build_policy("taskplane", metrics=False, admission=GATE)
    busy = [replica("r0", inflight_prefill_tokens=2_000)]
    for name, prio in (("b0", "batch"), ("b1", "batch"), ("crit", "critical")):
        assert s.decide(request(tokens(hash(name) % 1000, 4), call_id=name, priority=prio), busy, 1.0).action is Action.QUEUE
    order = []
    while s.queued:
        order += [r.call_id for r, _ in s.release([replica("r0")], 2.0 + len(order))]
    assert order == ["crit", "b0", "b1"]
