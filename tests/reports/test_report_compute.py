"""The report's arithmetic on plain records, checked against numbers worked out by hand."""

from __future__ import annotations

from datetime import timedelta

import pytest
from _report_scenario import SINCE, T0, UNTIL, fleet, hand_headline

from taskplane.reports.compute import build_report
from taskplane.reports.render import FORMATS, render, render_table, usd
from taskplane.reports.waste import cache_miss_usd, prefill_fraction
from taskplane.store.records import AttemptRecord, Outcome, TaskRecord, TaskStatus


def call(key: str, task: str | None, cost: float, outcome: Outcome = Outcome.SUCCESS, **kw: object) -> AttemptRecord:
    data: dict[str, object] = {
        "attempt_key": key,
        "task_id": task,
        "tenant": "a",
        "agent": "x",
        "model_requested": "m",
        "gpu": "h100",
        "cost_usd": cost,
        "outcome": outcome,
        "started_at": T0 + timedelta(seconds=len(key)),
    }
    data.update(kw)
    return AttemptRecord.model_validate(data)


def task(tid: str, status: TaskStatus, tenant: str = "a", deadline_met: bool | None = True) -> TaskRecord:
    return TaskRecord(task_id=tid, agent="x", tenant=tenant, status=status, deadline_met=deadline_met,
                      started_at=T0, finished_at=T0 + timedelta(minutes=1))


def small() -> tuple[list[AttemptRecord], list[TaskRecord]]:
    attempts = [
        call("t1-0", "t1", 0.10),
        call("t1-1a", "t1", 0.05, Outcome.ERROR),
        call("t1-1b", "t1", 0.10),
        call("t2-0", "t2", 0.20, tenant="b"),
        call("t2-1", "t2", 0.02, Outcome.TIMEOUT, tenant="b"),
        call("t3-0", "t3", 0.30),
        call("t4-0", "t4", 0.15, tenant="b", gpu="l40s"),
        call("t4-1", "t4", 0.0, Outcome.SHED, tenant="b"),
        call("none", None, 0.01),
    ]
    tasks = [
        task("t1", TaskStatus.SUCCEEDED),
        task("t2", TaskStatus.FAILED, tenant="b", deadline_met=False),
        task("t3", TaskStatus.SUCCEEDED, deadline_met=False),  # late: not a success
        task("t4", TaskStatus.SUCCEEDED, tenant="b", deadline_met=None),  # no deadline: a success
    ]
    return attempts, tasks


def test_headline_worked_by_hand() -> None:
    r = build_report(*small())
    assert r.total_cost_usd == pytest.approx(0.93)
    assert (r.tasks_succeeded, r.tasks_succeeded_late, r.tasks_failed) == (2, 1, 1)
    assert r.cost_per_successful_task_usd == pytest.approx(0.93 / 2)
    assert r.calls == 9
    assert r.cost_per_request_usd == pytest.approx(0.93 / 9)
    assert r.waste.failed_tasks_usd == pytest.approx(0.22)
    assert r.waste.retries_usd == pytest.approx(0.05)
    assert r.waste.shed_usd == 0.0
    assert r.tasks_by_status == {"failed": 1, "succeeded": 3}
    assert r.calls_by_outcome == {"error": 1, "shed": 1, "success": 6, "timeout": 1}


def test_groups_by_tenant_and_gpu() -> None:
    tenants = {g.key: g for g in build_report(*small(), group_by="tenant").groups}
    assert tenants["a"].total_cost_usd == pytest.approx(0.56)
    assert tenants["a"].tasks_succeeded == 1
    assert tenants["a"].cost_per_successful_task_usd == pytest.approx(0.56)
    assert tenants["b"].total_cost_usd == pytest.approx(0.37)
    assert tenants["b"].cost_per_successful_task_usd == pytest.approx(0.37)
    gpus = {g.key: g for g in build_report(*small(), group_by="gpu").groups}
    # t4 touched both GPUs (its shed call has the default gpu), so it counts in both
    assert gpus["l40s"].tasks_succeeded == 1 and gpus["h100"].tasks_succeeded == 2
    assert gpus["l40s"].total_cost_usd == pytest.approx(0.15)


def adapter_calls() -> tuple[list[AttemptRecord], list[TaskRecord]]:
    """t1 on adapter a (twice), t2 on a and the base model, t3 (failed) on b."""
    attempts = [
        call("t1-0", "t1", 0.10, adapter="a"),
        call("t1-1", "t1", 0.20, adapter="a"),
        call("t2-0", "t2", 0.30, adapter="a"),
        call("t2-1", "t2", 0.40),
        call("t3-0", "t3", 0.50, adapter="b"),
    ]
    tasks = [task("t1", TaskStatus.SUCCEEDED), task("t2", TaskStatus.SUCCEEDED), task("t3", TaskStatus.FAILED)]
    return attempts, tasks


def test_groups_by_adapter() -> None:
    groups = {g.key: g for g in build_report(*adapter_calls(), group_by="adapter").groups}
    assert set(groups) == {"a", "b", "(base model)"}
    # a task counts in every adapter group its calls touched
    assert groups["a"].total_cost_usd == pytest.approx(0.60) and groups["a"].tasks_succeeded == 2
    assert groups["a"].cost_per_successful_task_usd == pytest.approx(0.30)
    assert groups["(base model)"].cost_per_successful_task_usd == pytest.approx(0.40)
    assert groups["b"].tasks_failed == 1 and groups["b"].cost_per_successful_task_usd is None


def test_tenant_filter_and_window() -> None:
    r = build_report(*small(), tenant="b")
    assert r.total_cost_usd == pytest.approx(0.37) and r.tasks_succeeded == 1 and r.tasks_failed == 1
    empty = build_report(*small(), since=T0 + timedelta(days=1))
    assert empty.total_cost_usd == 0 and empty.cost_per_successful_task_usd is None
    for fmt in FORMATS:
        assert render(empty, fmt)  # every format renders an empty window


def test_cache_miss_estimate() -> None:
    first = call("s-1", "t", 0.05, session_id="s", prompt_tokens=1000, completion_tokens=100)
    second = call("s-2", "t", 0.13, session_id="s", prompt_tokens=1500, cached_tokens=200,
                  queue_ms=0.0, ttft_ms=100.0, total_ms=500.0, started_at=first.started_at + timedelta(seconds=5))
    assert prefill_fraction(second) == pytest.approx(0.2)
    # the session had built 1100 tokens; 200 came from cache; 900 were prefilled again out of 1300 uncached
    assert cache_miss_usd(second, 1100) == pytest.approx(0.13 * 0.2 * 900 / 1300)
    r = build_report([first, second], [task("t", TaskStatus.SUCCEEDED)])
    assert r.waste.cache_miss_usd == pytest.approx(0.13 * 0.2 * 900 / 1300)
    assert r.cache_hit_ratio == pytest.approx(200 / 2500)
    # without timings the token shares stand in: 1300 uncached vs 10 completion tokens
    no_timing = second.model_copy(update={"ttft_ms": None, "completion_tokens": 10})
    assert prefill_fraction(no_timing) == pytest.approx(1300 / 1310)


def test_fleet_matches_hand_computation() -> None:
    attempts, tasks = fleet()
    total, ok, failed, per_task = hand_headline(attempts, tasks)
    r = build_report(attempts, tasks, since=SINCE, until=UNTIL)
    assert r.total_cost_usd == pytest.approx(total)
    assert (r.tasks_succeeded, r.tasks_failed) == (ok, failed)
    assert r.cost_per_successful_task_usd == pytest.approx(per_task)
    assert sum(g.total_cost_usd for g in r.groups) == pytest.approx(total)
    assert sum(p.total_cost_usd for p in r.timeline) == pytest.approx(total)
    assert r.waste.total_usd <= r.total_cost_usd
    for tenant in ("acme", "globex"):
        t_total, _, _, t_per = hand_headline(attempts, tasks, tenant=tenant)
        rt = build_report(attempts, tasks, since=SINCE, until=UNTIL, tenant=tenant)
        assert rt.total_cost_usd == pytest.approx(t_total)
        assert rt.cost_per_successful_task_usd == pytest.approx(t_per)


def test_unknown_group_by() -> None:
    with pytest.raises(ValueError, match="unknown group-by"):
        build_report([], [], group_by="colour")


def test_an_80_column_table_cuts_no_figure() -> None:
    """Piped output (a CI log, ``| less``) is 80 columns wide in rich: every tenant's cost
    and cost per successful task must still be there whole, not ``$0.0008…``."""
    attempts, tasks = fleet()
    report = build_report(attempts, tasks, since=SINCE, until=UNTIL, group_by="tenant")
    text = render_table(report, width=80)
    groups = text[text.index("By tenant"):]
    assert "…" not in groups.split("Tasks that did not succeed")[0]
    for g in report.groups:
        assert usd(g.total_cost_usd) in groups and usd(g.cost_per_successful_task_usd) in groups
    assert max(len(line) for line in text.splitlines()) <= 80
