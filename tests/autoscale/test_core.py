"""The pure autoscaler core: decisions from signals, the fleet book's life cycles."""

from __future__ import annotations

from taskplane.autoscale.baselines import AibrixKpa, DynamoPlanner, FixedPeak, HpaQueue, KpaConfig
from taskplane.autoscale.fleet import FleetBook
from taskplane.autoscale.planner import PlannerConfig, TaskplaneAutoscaler
from taskplane.autoscale.registry import autoscaler_names, parse_range
from taskplane.autoscale.types import (
    AgentProfile,
    Generation,
    Phase,
    Plan,
    PoolSignals,
    ReplicaState,
    WorkflowSignal,
)

H100 = Generation("h100", 2.5, cold_start_s=18.0, capacity_per_s=1000.0, max_replicas=8)
L40S = Generation("l40s", 1.0, cold_start_s=25.0, capacity_per_s=310.0, max_replicas=8)
B200 = Generation("b200", 5.5, cold_start_s=18.0, capacity_per_s=2400.0, max_replicas=8)
PROF = AgentProfile(work_per_step=500.0, seconds_per_step=5.0)  # 100 work units/s per live workflow


def sig(now: float, replicas: list[ReplicaState], workflows: int = 0, **kw: object) -> PoolSignals:
    wfs = [WorkflowSignal(task_id=f"t{i}", agent="a", steps_remaining=20) for i in range(workflows)]
    return PoolSignals(pool="m", now_s=now, replicas=replicas, generations=kw.pop("gens", [H100]),  # type: ignore[arg-type]
                       workflows=wfs, profiles={"a": PROF}, default_profile=PROF, min_replicas=0, max_replicas=8,
                       **kw)  # type: ignore[arg-type]


def ready(name: str, **kw: object) -> ReplicaState:
    return ReplicaState(name=name, gpu="h100", phase=Phase.READY, **kw)  # type: ignore[arg-type]


def test_taskplane_scales_out_for_workflows_before_any_queue() -> None:
    # 25 live workflows x 100 work/s = 2500/s: three H100s, though no request waits yet
    plan = TaskplaneAutoscaler(PlannerConfig(target_load=1.0)).plan(sig(0.0, [ready("a")], workflows=25))
    assert plan.start == ["h100", "h100"] and plan.desired == 3
    assert "demand" in plan.reasons[0]


def test_taskplane_is_price_aware() -> None:
    # per unit of work: h100 2.5/1000, l40s 1.0/310 (dearer), b200 5.5/2400 (cheapest)
    plan = TaskplaneAutoscaler(PlannerConfig(target_load=1.0)).plan(sig(0.0, [], workflows=20, gens=[H100, L40S, B200]))
    assert set(plan.start) == {"b200"}
    slow = Generation("cpu", 0.1, cold_start_s=5.0, capacity_per_s=100.0, meets_slo=False)
    plan = TaskplaneAutoscaler(PlannerConfig(target_load=1.0)).plan(sig(0.0, [], workflows=5, gens=[slow, H100]))
    assert plan.start and set(plan.start) == {"h100"}  # the cheap one misses the SLO


def test_taskplane_scale_in_cordons_the_cheapest_loss_after_a_delay() -> None:
    a = TaskplaneAutoscaler(PlannerConfig(target_load=1.0, scale_in_delay_s=30.0))
    reps = [ready("a", live_session_tokens=9000, live_sessions=3), ready("b", live_session_tokens=100, live_sessions=1),
            ready("c", live_session_tokens=4000, live_sessions=2)]
    assert a.plan(sig(0.0, reps, workflows=3)).cordon == []  # low demand, but not for long yet
    plan = a.plan(sig(40.0, reps, workflows=3))
    assert plan.cordon == ["b"] and plan.drain == []
    # cordoned: drained once its last live session ended, never killed (grace None)
    reps[1].phase, reps[1].phase_since_s = Phase.CORDONED, 40.0
    assert a.plan(sig(45.0, reps, workflows=3)).drain == []
    reps[1].live_sessions = 0
    plan = a.plan(sig(46.0, reps, workflows=3))
    assert plan.drain == ["b"] and plan.grace_s is None


def test_taskplane_uncordons_before_starting_cold() -> None:
    reps = [ready("a"), ReplicaState(name="b", gpu="h100", phase=Phase.CORDONED, live_session_tokens=50)]
    plan = TaskplaneAutoscaler(PlannerConfig(target_load=1.0)).plan(sig(0.0, reps, workflows=15))
    assert plan.uncordon == ["b"] and plan.start == []  # 1500 work/s: the warm one suffices
    plan = TaskplaneAutoscaler(PlannerConfig(target_load=1.0)).plan(sig(0.0, reps, workflows=25))
    assert plan.uncordon == ["b"] and plan.start == ["h100"]


def test_idle_pool_goes_to_zero_and_a_held_call_wakes_it() -> None:
    a = TaskplaneAutoscaler(PlannerConfig(target_load=1.0, idle_to_zero_s=60.0))
    reps = [ready("a")]
    assert a.plan(sig(0.0, reps)).cordon == []
    assert a.plan(sig(61.0, reps)).cordon == ["a"]
    plan = a.plan(sig(100.0, [], held_requests=1))
    assert plan.start == ["h100"]


def test_hpa_waits_out_its_stabilization_window_and_kills_after_grace() -> None:
    h = HpaQueue()
    reps = [ready(f"r{i}", num_waiting=6, ready_s=float(i)) for i in range(2)]
    plan = h.plan(sig(0.0, reps))
    assert plan.desired == 6 and len(plan.start) == 4  # ratio 3, capped at max(2x, +4)
    calm = [ready(f"r{i}", ready_s=float(i)) for i in range(6)]
    assert h.plan(sig(100.0, calm)).drain == []  # 300 s window still remembers 6
    plan = h.plan(sig(400.0, calm))
    assert plan.drain == ["r5", "r4", "r3", "r2", "r1", "r0"] and plan.grace_s == 30.0  # newest first, to min 0


def test_kpa_panics_and_dynamo_steps_one_at_a_time() -> None:
    k = AibrixKpa(KpaConfig(target_concurrency=10.0))
    reps = [ready("a", num_running=10)]
    assert k.plan(sig(0.0, reps)).desired == 1
    burst = [ready("a", num_running=50)]
    plan = k.plan(sig(3.0, burst))
    assert plan.desired >= 3  # panic window sees the burst
    d = DynamoPlanner()
    full = [ready("a", kv_usage=0.95)]
    d.plan(sig(0.0, full))
    plan = d.plan(sig(30.0, full))
    assert plan.start == ["h100"] and plan.grace_s == 0.0  # terminates without waiting
    assert FixedPeak(4).plan(sig(0.0, [])).start == ["h100"] * 4


def test_fleet_book_drains_then_stops_and_counts_fleet_hours() -> None:
    book = FleetBook("m", [H100])
    a = book.provision("h100", 0.0, ready=True)
    from taskplane.autoscale.types import Plan

    acts = book.apply(Plan(pool="m", desired=2, start=["h100"]), 0.0)
    (b, _), = acts.start
    assert book.replicas[b].phase is Phase.STARTING and not book.placeable(b)
    book.mark_ready(b, 18.0)
    assert book.placeable(b)
    book.replicas[a].num_running = 2
    acts = book.apply(Plan(pool="m", desired=1, drain=[a], grace_s=None), 100.0)
    assert acts.unplaceable == [a] and book.due(5000.0) == []  # in flight: waits, however long
    book.replicas[a].num_running = 0
    assert book.due(5001.0) == [(a, False)]
    book.stopped(a, 5001.0, reason="drained")
    assert abs(book.gpu_hours(7200.0) - (5001.0 + 7200.0) / 3600.0) < 1e-9
    assert abs(book.cost_usd(7200.0) - 2.5 * (5001.0 + 7200.0) / 3600.0) < 1e-9
    # a grace period kills what is still running when it ends
    book.replicas[b].num_running = 1
    book.apply(Plan(pool="m", desired=0, drain=[b], grace_s=30.0), 7200.0)
    assert book.due(7210.0) == [] and book.due(7230.0) == [(b, True)]


def test_registry_and_range() -> None:
    assert autoscaler_names() == ["fixed-peak", "hpa-queue", "dynamo-planner", "aibrix-kpa", "taskplane"]
    assert parse_range("1:4") == (1, 4)
    for bad in ("4:1", "x", "-1:2"):
        try:
            parse_range(bad)
        except ValueError:
            continue
        raise AssertionError(bad)


H100_SLEEPS = Generation("h100", 2.5, cold_start_s=18.0, capacity_per_s=1000.0, max_replicas=8, wake_s=1.4)


def test_a_sleeping_replica_is_woken_before_any_cold_start_and_paid_for_while_asleep() -> None:
    book = FleetBook("m", [H100_SLEEPS], sleep_level=1)
    for _ in range(2):
        book.provision("h100", 0.0, ready=True)
    b_name = list(book.replicas)[1]
    book.apply(plan_of(drain=[b_name]), 10.0)
    assert book.due(20.0) == [(b_name, False)]
    book.slept(b_name, 20.0)
    assert book.replicas[b_name].phase is Phase.SLEEPING and not book.placeable(b_name)
    assert book.gpu_hours(3600.0) == 2.0  # asleep, it still holds its GPU: provisioned hours

    a = TaskplaneAutoscaler(PlannerConfig(target_load=1.0))
    s = sig(100.0, list(book.replicas.values()), workflows=25, gens=[H100_SLEEPS])
    plan = a.plan(s)
    assert plan.wake == [b_name] and plan.start == ["h100"] and plan.desired == 3
    acts = book.apply(plan, 100.0)
    assert acts.wake == [b_name] and book.replicas[b_name].phase is Phase.STARTING
    book.mark_ready(b_name, 101.4)
    assert book.placeable(b_name) and book.intervals[b_name].ready_s == 0.0  # its first ready time kept


def test_a_replica_left_asleep_too_long_is_deleted() -> None:
    book = FleetBook("m", [H100_SLEEPS], sleep_level=1)
    keep = book.provision("h100", 0.0, ready=True)
    nap = book.provision("h100", 0.0, ready=True)
    book.apply(plan_of(drain=[nap]), 0.0)
    book.slept(nap, 5.0)
    a = TaskplaneAutoscaler(PlannerConfig(sleep_max_s=600.0))
    wf = {"workflows": 1}
    assert nap not in a.plan(sig(300.0, list(book.replicas.values()), **wf, gens=[H100_SLEEPS])).drain
    plan = a.plan(sig(606.0, list(book.replicas.values()), **wf, gens=[H100_SLEEPS]))
    assert plan.drain == [nap]
    acts = book.apply(plan, 606.0)
    assert acts.stop == [(nap, False)] and keep in book.replicas


def test_a_held_call_at_zero_ready_wakes_a_sleeper() -> None:
    book = FleetBook("m", [H100_SLEEPS], sleep_level=2)
    nap = book.provision("h100", 0.0, ready=True)
    book.apply(plan_of(drain=[nap]), 0.0)
    book.slept(nap, 1.0)
    plan = TaskplaneAutoscaler().plan(sig(200.0, list(book.replicas.values()), held_requests=1, gens=[H100_SLEEPS]))
    assert plan.wake == [nap] and plan.start == []


def plan_of(**kw: list[str]) -> Plan:
    return Plan(pool="m", desired=0, **kw)  # type: ignore[arg-type]


def test_a_baseline_scale_out_waits_for_gpus_that_draining_replicas_still_hold() -> None:
    """As a pod scaled up beside terminating ones stays Pending: with 2 GPUs, one replica
    draining and one serving, a scale-out to 3 starts nothing now and the rest later."""
    two = Generation("h100", 2.5, cold_start_s=18.0, capacity_per_s=1000.0, max_replicas=2)
    reps = [ready("a", num_running=50), ReplicaState(name="b", gpu="h100", phase=Phase.DRAINING)]
    plan = FixedPeak(3).plan(sig(0.0, reps, gens=[two]))
    assert plan.start == [] and "wait for a GPU" in plan.reasons[0]
    plan = FixedPeak(3).plan(sig(60.0, [ready("a")], gens=[two]))  # b has stopped: its GPU is free
    assert plan.start == ["h100"]


def _pinned(replica: str, steps: int, n: int = 1) -> list[WorkflowSignal]:
    return [WorkflowSignal(task_id=f"{replica}{i}", agent="a", steps_remaining=steps, replica=replica)
            for i in range(n)]


def test_the_victim_is_the_replica_whose_sessions_end_soonest_and_is_predrained_first() -> None:
    # "few" holds the fewest tokens but a session with 20 steps (100 s) to go; "soon" more
    # tokens, all of them one step (5 s) from their end: giving up "soon" costs a short cordon
    a = TaskplaneAutoscaler(PlannerConfig(target_load=1.0, scale_in_delay_s=30.0))
    reps = [ready("few", live_session_tokens=100, live_sessions=1),
            ready("soon", live_session_tokens=6000, live_sessions=2),
            ready("busy", live_session_tokens=9000, live_sessions=3)]
    s = sig(0.0, reps)
    s.workflows = [*_pinned("few", 20), *_pinned("soon", 1, 2), *_pinned("busy", 20, 3)]
    first = a.plan(s)
    # demand fell below the line: not cordoned yet (the delay runs), but no new session there
    assert first.cordon == [] and first.predrain == ["soon"]
    book = FleetBook("m", [H100])
    for name in ("few", "soon", "busy"):
        book.provision("h100", 0.0, name=name, ready=True)
    book.apply(first, 0.0)
    assert book.placeable("soon") and not book.takes_new_sessions("soon") and book.takes_new_sessions("few")
    s.now_s = 40.0
    later = a.plan(s)
    assert later.cordon == ["soon"] and later.predrain == []
    book.apply(later, 40.0)
    assert book.takes_new_sessions("few") and book.predrained == set()


def test_a_cordoned_replica_stops_waiting_once_waiting_costs_more_than_the_reprefill() -> None:
    cordoned = ReplicaState(name="c", gpu="h100", phase=Phase.CORDONED, phase_since_s=0.0,
                            live_session_tokens=2000, live_sessions=1)
    s = sig(10.0, [ready("a"), cordoned])
    # 2,000 tokens re-prefill in 2000 x 0.125 / 1000 = 0.25 GPU-s; a session 20 steps (100 s)
    # from its end would hold the whole GPU far longer: move it now
    s.workflows = _pinned("c", 20)
    assert TaskplaneAutoscaler().plan(s).drain == ["c"]
    # a huge context nearly done: waiting is cheaper
    cordoned.live_session_tokens = 10_000_000
    s.workflows = _pinned("c", 1)
    assert TaskplaneAutoscaler().plan(s).drain == []
    # unpriced (the cap alone), the long session is waited for up to cordon_max_s
    cordoned.live_session_tokens = 2000
    s.workflows = _pinned("c", 20)
    assert TaskplaneAutoscaler(PlannerConfig(price_cordon=False)).plan(s).drain == []


def test_a_slow_cold_start_plans_for_the_arrivals_still_running_at_its_end_not_all_of_them() -> None:
    """Arrivals at 1 per second, tasks of 4 steps x 5 s = 20 s (100 work units/s each): one
    cold start from now, 20 of them run at once, whether the cold start is 18 s or 120 s."""
    profile = AgentProfile(work_per_step=500.0, seconds_per_step=5.0, steps_per_task=4.0)
    s = sig(0.0, [ready("r0")], arrivals_per_s=1.0)
    s.profiles, s.default_profile = {"a": profile}, profile
    scaler = TaskplaneAutoscaler()
    assert scaler.demand(s, horizon_s=10.0) == 10 * 100.0  # shorter than a task: all of them still run
    assert scaler.demand(s, horizon_s=130.0) == 20 * 100.0  # longer: only the last 20 s of arrivals


def test_a_fleet_with_many_spare_replicas_gives_them_up_faster_than_one_per_delay() -> None:
    """8 replicas of 1,000 work units/s and 300 needed (3 live workflows): about 7.6 are spare,
    so the 60 s scale-in delay shrinks to 60 / floor(7.6 / 2) = 20 s; with one spare it stays 60 s."""
    def shrinks_by(t: float, n_replicas: int) -> bool:
        a = TaskplaneAutoscaler(PlannerConfig(target_load=1.0, scale_in_delay_s=60.0, interval_s=1.0))
        reps = [ready(f"r{i}") for i in range(n_replicas)]
        a.plan(sig(0.0, reps, workflows=3))
        return bool(a.plan(sig(t, reps, workflows=3)).cordon)

    assert not shrinks_by(15.0, 8) and shrinks_by(25.0, 8)
    assert not shrinks_by(25.0, 2)  # one spare: the whole delay
    assert shrinks_by(61.0, 2)


def test_the_forecast_a_cold_start_ahead_is_planned_with_its_own_headroom() -> None:
    """10 live workflows need 1,000 work units/s now; a cold start ahead (28 s) the 20 s of
    arrivals at 1 per second add 2,000. The forecast already counts every workflow expected,
    so it is divided by ``forecast_load``, the demand of now by ``target_load``."""
    profile = AgentProfile(work_per_step=500.0, seconds_per_step=5.0, steps_per_task=4.0)

    def planned(cfg: PlannerConfig, arrivals: float) -> float:
        s = sig(0.0, [ready("r0")], workflows=10, arrivals_per_s=arrivals)
        s.profiles, s.default_profile = {"a": profile}, profile
        scaler = TaskplaneAutoscaler(cfg)
        scaler.plan(s)
        return scaler.last_demand

    assert planned(PlannerConfig(target_load=1.0, forecast_load=2.0), 0.0) == 1000.0  # now: no forecast share
    assert planned(PlannerConfig(target_load=1.0, forecast_load=2.0), 1.0) == 3000.0 / 2.0
    assert planned(PlannerConfig(target_load=1.0, forecast_load=None), 1.0) == 3000.0
    assert planned(PlannerConfig(target_load=0.5, forecast_load=2.0), 1.0) == 1000.0 / 0.5  # now is the larger
