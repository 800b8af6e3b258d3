"""The simulator's fleet: replicas start after a cold start, drain, stop; the same placement."""

from __future__ import annotations

import json
from pathlib import Path

from taskplane.autoscale.baselines import DynamoConfig, DynamoPlanner, FixedPeak
from taskplane.autoscale.planner import PlannerConfig, TaskplaneAutoscaler
from taskplane.bench.diurnal import DayCurve, autoscaler_metrics, warp_workload
from taskplane.bench.diurnal_command import diurnal_workload
from taskplane.bench.workloads import agent_workload
from taskplane.scheduler.policies import build_policy
from taskplane.sim.elastic import FleetOptions, generation, simulate_fleet
from taskplane.sim.hints import HintMode
from taskplane.store.records import TaskStatus

DAY = DayCurve(day_s=900.0, ramp_s=150.0, peak_s=200.0)


def run(scaler: object, initial: int = 1, min_replicas: int = 1) -> object:
    wl = warp_workload(agent_workload(int(0.5 * DAY.mean() * DAY.day_s), 0.5, 3), DAY)
    gens = [generation("h100", "llama-3.1-8b", max_replicas=4, capacity_per_s=1400.0)]
    pool = FleetOptions(generations=gens, min_replicas=min_replicas, max_replicas=4, initial=initial,
                        horizon_s=DAY.day_s)
    return simulate_fleet(wl, build_policy("taskplane", seed=1, metrics=False), scaler, pool, seed=1)


def test_warp_follows_the_curve() -> None:
    times = DAY.warp([float(i) for i in range(400)], 1.0)
    assert times == sorted(times)
    trough = sum(1 for t in times if t < 100.0)
    peak_start = (DAY.day_s - 2 * DAY.ramp_s - DAY.peak_s) / 2 + DAY.ramp_s
    peak = sum(1 for t in times if peak_start <= t < peak_start + 100.0)
    assert peak > 8 * trough  # 1.3x against 0.1x


def test_the_clairvoyant_fleet_follows_the_curve_in_whole_replicas() -> None:
    flat = DayCurve(day_s=3600.0, trough=1.0, peak=1.0)
    assert flat.clairvoyant_gpu_hours(4) == 4.0
    # trough 0.1 x 4 replicas = 0.4 -> the floor of 1; the peak 1.3 x 4 = 5.2 -> 6
    day = DayCurve()
    assert 1.0 < day.clairvoyant_gpu_hours(4) < 6.0
    idle_nights = DayCurve(trough=0.0)
    assert idle_nights.clairvoyant_gpu_hours(4, min_replicas=0) < idle_nights.clairvoyant_gpu_hours(4)
    steps = DayCurve(day_s=3600.0, trough=0.1, peak=1.3, ramp_s=1e-6, peak_s=1800.0)
    assert abs(steps.clairvoyant_gpu_hours(4) - (0.5 * 1 + 0.5 * 6)) < 1e-3


def test_taskplane_grows_and_shrinks_without_failing_a_call() -> None:
    res = run(TaskplaneAutoscaler(PlannerConfig(scale_in_delay_s=30.0)))
    m = autoscaler_metrics(res, 1.0)  # type: ignore[arg-type]
    sizes = [p for _, p, _, _ in res.stats.timeline]  # type: ignore[attr-defined]
    assert max(sizes) > 1 and sizes[-1] < max(sizes)
    assert m["cold_starts"] >= 1 and m["failed_inflight_calls"] == 0
    assert not [c for c in res.cluster.calls if c.error_type == "replica_error"]  # type: ignore[attr-defined]
    # every provisioned interval is paid from its start; a stopped one ended with a drain
    closed = [iv for iv in res.intervals if iv.stopped_s is not None]  # type: ignore[attr-defined]
    assert closed and all(iv.stop_reason == "drained" for iv in closed)
    fixed = autoscaler_metrics(run(FixedPeak(4), initial=4), 1.0)  # type: ignore[arg-type]
    assert m["gpu_hours"] < fixed["gpu_hours"] == round(4 * DAY.day_s / 3600.0, 4) or fixed["gpu_hours"] > 1.0
    assert m["tasks_succeeded"] >= 0.9 * fixed["tasks_succeeded"]


def test_a_kill_at_scale_in_fails_calls_in_flight_and_they_are_retried() -> None:
    scaler = DynamoPlanner(DynamoConfig(kv_scale_up=0.05, kv_scale_down=0.04, queue_scale_down=100.0))
    res = run(scaler, initial=4)
    m = autoscaler_metrics(res, 1.0)  # type: ignore[arg-type]
    killed = [iv for iv in res.intervals if iv.stop_reason == "killed"]  # type: ignore[attr-defined]
    assert killed and m["failed_inflight_calls"] == sum(iv.killed_inflight for iv in killed)
    errors = [c for c in res.cluster.calls if c.error_type == "replica_error"]  # type: ignore[attr-defined]
    assert len(errors) >= m["failed_inflight_calls"]
    assert sum(1 for t in res.cluster.tasks if t.status is TaskStatus.SUCCEEDED) > 0  # type: ignore[attr-defined]


def test_scale_to_zero_holds_the_next_call_until_a_replica_wakes() -> None:
    res = run(TaskplaneAutoscaler(PlannerConfig(idle_to_zero_s=20.0)), initial=0, min_replicas=0)
    calls = res.cluster.calls  # type: ignore[attr-defined]
    assert not [c for c in calls if c.error_type == "no_replica"]  # held, never refused
    first = min(calls, key=lambda c: c.offered_s)
    cold = generation("h100", "llama-3.1-8b", max_replicas=1, capacity_per_s=1.0).cold_start_s
    assert first.offered_s < cold <= first.dispatched_s  # held until the first replica was ready


def test_a_trace_is_bent_onto_the_curve(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    lines = [json.dumps({"timestamp": i * 1000, "input_length": 1024, "output_length": 16,
                         "hash_ids": [i % 7, 100 + i]}) for i in range(300)]
    trace.write_text("\n".join(lines))
    wl = diurnal_workload(0.0, DAY, 1, trace)
    times = sorted(c.at_s for t in wl.tasks for c in t.calls if c.at_s is not None)
    assert len(times) == 300 and 0.0 <= times[0] and times[-1] <= DAY.day_s * 1.01
    peak_start = (DAY.day_s - 2 * DAY.ramp_s - DAY.peak_s) / 2 + DAY.ramp_s
    in_peak = sum(1 for t in times if peak_start <= t < peak_start + 100.0)
    in_trough = sum(1 for t in times if t < 100.0)
    assert in_peak > 5 * max(in_trough, 1)
    assert all(t.arrival_s == min(c.at_s for c in t.calls) for t in wl.tasks)  # type: ignore[type-var]


def _two_days() -> object:
    """Two diurnal days back to back: the first day's scale-in leaves sleepers, the second's
    ramp is where a sleeper beats a cold start."""
    from dataclasses import replace

    from taskplane.sim.workloads.base import Workload

    n = int(0.5 * DAY.mean() * DAY.day_s)
    one = warp_workload(agent_workload(n, 0.5, 3), DAY)
    two = warp_workload(agent_workload(n, 0.5, 4), DAY)
    later = [replace(t, task_id=f"day2-{t.task_id}", session_id=f"day2-{t.session_id or t.task_id}",
                     arrival_s=t.arrival_s + DAY.day_s) for t in two.tasks]
    return Workload(name="two-days", tasks=[*one.tasks, *later], block_size=one.block_size)


def test_with_sleep_mode_scale_in_sleeps_and_the_next_ramp_wakes_instead_of_cold_starting() -> None:
    wl = _two_days()
    out = {}
    for level in (0, 1):
        gens = [generation("h100", "llama-3.1-8b", max_replicas=4, capacity_per_s=1400.0)]
        pool = FleetOptions(generations=gens, min_replicas=1, max_replicas=4, initial=1, horizon_s=2 * DAY.day_s,
                            sleep_level=level)
        out[level] = simulate_fleet(wl, build_policy("taskplane", seed=1, metrics=False),  # type: ignore[arg-type]
                                    TaskplaneAutoscaler(PlannerConfig(scale_in_delay_s=30.0)), pool, seed=1)
    off, on = out[0], out[1]
    assert off.stats.sleeps == off.stats.wakes == 0
    assert on.stats.sleeps >= 1 and on.stats.wakes >= 1
    assert on.stats.cold_starts < off.stats.cold_starts  # the second ramp woke sleepers instead
    for res in (off, on):
        assert res.stats.failed_inflight_calls == 0
        assert not [c for c in res.cluster.calls if c.error_type == "replica_error"]
    # a sleeper is paid for: its interval runs on until it is woken or has slept sleep_max_s
    # (a drained replica never stops while it may sleep)
    closed = [iv.stop_reason for iv in on.intervals if iv.stopped_s is not None]
    assert set(closed) <= {"asleep too long"}
    assert on.gpu_hours > off.gpu_hours


class _Watching(FixedPeak):
    """The fixed fleet, remembering what the planner was told of each workflow."""

    def __init__(self) -> None:
        super().__init__(2)
        self.seen: dict[str, list[int]] = {}  # task -> steps remaining, tick by tick

    def plan(self, s: object) -> object:
        for w in s.workflows:  # type: ignore[attr-defined]
            self.seen.setdefault(w.task_id, []).append(w.steps_remaining)
        return super().plan(s)  # type: ignore[arg-type]


def _watched(hints: HintMode) -> tuple[_Watching, dict[str, int]]:
    wl = agent_workload(40, 0.5, 3)
    gens = [generation("h100", "llama-3.1-8b", max_replicas=2, capacity_per_s=1400.0)]
    scaler = _Watching()
    pool = FleetOptions(generations=gens, min_replicas=2, max_replicas=2, initial=2, horizon_s=120.0)
    simulate_fleet(wl, build_policy("taskplane", seed=1, metrics=False), scaler, pool, seed=1, hints=hints)
    return scaler, {t.task_id: len(t.calls) for t in wl.tasks}


def test_the_planner_is_told_the_sdk_hints_not_the_true_steps_left() -> None:
    exact, true = _watched(HintMode.EXACT)
    first = next(iter(exact.seen))
    assert exact.seen[first][0] == true[first]  # the labelled oracle: the true count
    author, _ = _watched(HintMode.AUTHOR)
    wl = {t.task_id: t for t in agent_workload(40, 0.5, 3).tasks}
    for task_id, told in author.seen.items():  # the author's one figure per agent, counted down
        assert told[0] <= max(1, wl[task_id].expected_steps or 0) and told == sorted(told, reverse=True)
    assert any(told[0] != true[k] for k, told in author.seen.items())
    blind, _ = _watched(HintMode.NONE)
    # no hint, no task finished yet: the first workflow is planned on the prior, not its length
    assert blind.seen[first][0] == 5 != true[first]
