"""Late binding under a prefill backlog (``AdmissionSettings.max_prefill_backlog_ms``): a call
is held in flow control while every eligible replica has more prefill queued than the
threshold, and released to the first replica that drains below it."""

from __future__ import annotations

from _sched_util import fleet, replica, request, tokens

from taskplane.scheduler import Action, CallOutcome, build_policy
from taskplane.scheduler.flowcontrol.backlog import queued_prefill_ms
from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.scheduler.policies import build_scheduler
from taskplane.scheduler.table import as_table
from taskplane.scheduler.types import ReplicaView

DEEP = 24_000  # prompt tokens queued: ~2 s of prefill on an H100 (12k tokens/s prior)


def deep(name: str, **kw: object) -> ReplicaView:
    """A replica that is not saturated (no engine-queued call) but has ~2 s of prefill ahead."""
    return replica(name, inflight_prefill_tokens=DEEP, **kw)


def test_the_backlog_is_the_latency_models_queue_without_cold_start() -> None:
    pipe = build_policy("taskplane", metrics=False, admission=FIXED).pipeline
    table = as_table([deep("r0"), deep("r1", model_loaded=False), replica("r2")])
    ms = queued_prefill_ms(pipe.state(request(), table, pipe.pool(table, "m", ()), 0.0, "m"))
    assert 1500 < ms[0] < 2500  # 24k tokens at ~12k tokens/s
    assert abs(ms[1] - ms[0]) < 1e-6  # a cold start is not prefill work
    assert ms[2] == 0.0


# late binding alone (the prefill gate: test_prefill_gate.py), as a fixed hold: these tests
# show what the hold does; when it pays (a small call on deep queues does not): test_hold_pays.py
NO_GATE = AdmissionSettings(serial_prefill=False, hold_pays=False, working_set_short_queue_ms=None)
FIXED = AdmissionSettings(hold_pays=False, working_set_short_queue_ms=None)


def test_held_while_every_replica_is_past_the_backlog_and_placed_when_off() -> None:
    on = build_policy("taskplane", metrics=False, admission=FIXED)
    assert AdmissionSettings().max_prefill_backlog_ms == 1000.0
    pool = [deep("r0"), deep("r1")]
    d = on.decide(request(call_id="c"), pool, 0.0)
    assert d.action is Action.QUEUE
    assert on.queued == 1
    off = build_scheduler(policy="taskplane", metrics=False,
                          admission=AdmissionSettings(max_prefill_backlog_ms=None, serial_prefill=False, hold_pays=False))
    assert off.decide(request(call_id="c"), pool, 0.0).action is Action.PLACE
    # one replica below the threshold: placed at once (on it: the other's queue is longer)
    mixed = [deep("r0"), replica("r1")]
    d = on.decide(request(call_id="c2", budget_ms=None), mixed, 0.0)
    assert d.action is Action.QUEUE  # behind the held call of its band: no overtaking
    fresh = build_policy("taskplane", metrics=False, admission=FIXED)
    d = fresh.decide(request(call_id="c3"), mixed, 0.0)
    assert d.action is Action.PLACE and d.replica == "r1"


def test_released_to_the_first_replica_that_drains_below() -> None:
    s = build_policy("taskplane", metrics=False, admission=FIXED)
    held = [request(tokens(i, 4), call_id=f"h{i}") for i in range(3)]
    for r in held:
        assert s.decide(r, [deep("r0"), deep("r1")], 0.0).action is Action.QUEUE
    assert s.release([deep("r0"), deep("r1")], 0.5) == []  # nothing drained: nothing moves
    out = s.release([deep("r0"), replica("r1", inflight_prefill_tokens=4_000)], 1.0)
    # to r1 only, until it has max_waiting_per_replica (2) engine-queued calls
    assert [(r.call_id, d.action, d.replica) for r, d in out] == [
        ("h0", Action.PLACE, "r1"), ("h1", Action.PLACE, "r1")]
    assert s.queued == 1


def test_a_release_pass_counts_the_prefill_it_commits() -> None:
    """Calls released in one pass add their own prefill: a replica that drained a little takes
    only what keeps it near the threshold; the rest wait for the next drain."""
    s = build_policy("taskplane", metrics=False, admission=FIXED)
    big = [request(tokens(i, 400), call_id=f"b{i}") for i in range(3)]  # 6,400 tokens: ~530 ms each
    for r in big:
        assert s.decide(r, [deep("r0")], 0.0).action is Action.QUEUE
    out = s.release([replica("r0", inflight_prefill_tokens=6_000)], 1.0)
    assert [r.call_id for r, _ in out] == ["b0"]  # 500 ms + 530 ms: past 1,000 ms after the first
    assert s.queued == 2
    out = s.release([replica("r0")], 2.0)
    assert [r.call_id for r, _ in out] == ["b1", "b2"]


def test_a_held_call_whose_deadline_cannot_be_met_is_refused_not_held() -> None:
    s = build_policy("taskplane", metrics=False, admission=FIXED)
    r = request(call_id="due", budget_ms=5_000)
    assert s.decide(r, [deep("r0"), deep("r1")], 0.0).action is Action.QUEUE
    assert s.release([deep("r0"), deep("r1")], 2.0) == []
    out = s.release([deep("r0"), deep("r1")], 5.5)
    assert [(x.call_id, d.action) for x, d in out] == [("due", Action.UNMEETABLE)]
    assert "deadline" in out[0][1].reason
    assert s.queued == 0


def test_no_starvation_across_tenants_and_bands() -> None:
    s = build_policy("taskplane", metrics=False, admission=FIXED)
    pool = [deep("r0"), deep("r1")]
    calls = [request(tokens(i, 4), call_id=f"{t}{i}", tenant=t) for i in range(3) for t in ("a", "b")]
    calls.append(request(tokens(50, 4), call_id="batch", priority="batch"))
    calls.append(request(tokens(51, 4), call_id="crit", priority="critical"))
    for r in calls:
        assert s.decide(r, pool, 0.0).action is Action.QUEUE
    order: list[str] = []
    for k in range(8):
        # each pass one replica has drained just enough for one call of ~2,000 tokens more
        out = s.release([replica("r0", inflight_prefill_tokens=9_000), deep("r1")], 1.0 + k)
        order += [r.call_id or "" for r, _ in out]
        assert len(out) <= 2
    while s.queued:
        order += [r.call_id or "" for r, _ in s.release(fleet(2), 20.0)]
    assert order[0] == "crit"
    assert sorted(order) == sorted(r.call_id or "" for r in calls)  # everyone is served
    standard = [c for c in order if c[0] in "ab"]
    assert standard[:4] in (["a0", "b0", "a1", "b1"], ["b0", "a0", "b1", "a1"])  # fair share holds
    assert order[-1] == "batch"


def test_a_pinned_session_is_not_held() -> None:
    s = build_policy("taskplane", metrics=False, admission=NO_GATE)
    idle = fleet(2)
    convo = tokens(1, 4)
    first = s.decide(request(convo, session_id="s", step=0, call_id="s0"), idle, 0.0)
    assert first.action is Action.PLACE
    home = first.replica or ""
    s.observe_completion(request(convo, session_id="s"), CallOutcome(replica=home), now_s=1.0)
    busy = [deep("r0"), deep("r1")]
    nxt = s.decide(request(convo + tokens(1, 1, start=len(convo)), session_id="s", step=1, call_id="s1"), busy, 2.0)
    assert nxt.action is Action.PLACE and nxt.replica == home
    # a new task's first call on the same busy fleet is held
    assert s.decide(request(tokens(9, 4), session_id="t", step=0, call_id="t0"), busy, 2.0).action is Action.QUEUE
