"""The cost report, computed from plain records (live Postgres rows and simulated runs alike).

The headline is cost per successful task, fully loaded: every dollar spent in the
window (failed tasks, retries and shed work included) divided by the tasks that
succeeded within their deadline. Next to it stand the naive figures (cost per token,
cost per request) so the gap is visible, and a waste breakdown (``waste.py``) that says
where the difference went. The SQL views of migration 0002 compute the same numbers; keep
the two in step (docs/costs.md has the definitions).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from taskplane.reports.model import FailedTask, GroupRow, Report
from taskplane.reports.tally import Spend, TaskCounts, ratio, task_time, utc
from taskplane.reports.timeline import timeline
from taskplane.reports.waste import WASTED_TASK, waste_of
from taskplane.store.records import AttemptRecord, TaskRecord

GROUP_BY: tuple[str, ...] = ("agent", "tenant", "model", "gpu", "day", "adapter")
NONE_KEY = "(none)"
#: The adapter group of calls that ran on the base model itself.
BASE_MODEL_KEY = "(base model)"

#: The report lists at most this many failed tasks (the latest first).
MAX_FAILED_LISTED = 50


def _in_window(t: datetime | None, since: datetime | None, until: datetime | None) -> bool:
    if t is None:
        return False
    return (since is None or t >= since) and (until is None or t < until)


def _day(t: datetime) -> str:
    return utc(t).date().isoformat()  # type: ignore[union-attr]


@dataclass(frozen=True)
class _Window:
    """The records a report counts, and the task each attempt's spend belongs to."""

    all_tasks: dict[str, TaskRecord]  # by id, the window's and any other passed in
    calls: list[AttemptRecord]  # the attempts started in the window
    in_window: list[TaskRecord]  # the tasks of the window, sub-agents' included
    tasks: list[TaskRecord]  # the counted tasks: goals, or every task with count_sub_agents
    count_sub_agents: bool

    def root_task(self, task_id: str | None) -> TaskRecord | None:
        """The goal an attempt belongs to: its task's root; for a sub-agent without a row of its
        own (rows written before sub-agents had them), the longest ``<goal id>.`` prefix."""
        tid = task_id or ""
        while tid:
            found = self.all_tasks.get(tid)
            if found is not None:
                return self.all_tasks.get(found.root_task_id, found) if found.root_task_id else found
            tid = tid.rpartition(".")[0]
        return None

    def owner(self, a: AttemptRecord) -> TaskRecord | None:
        """The counted task an attempt's spend goes to: its goal, or its own task when
        sub-agents count as tasks."""
        return self.all_tasks.get(a.task_id or "") if self.count_sub_agents else self.root_task(a.task_id)


def _select(attempts: Iterable[AttemptRecord], tasks: Iterable[TaskRecord], since: datetime | None,
            until: datetime | None, tenant: str | None, count_sub_agents: bool) -> _Window:
    all_tasks = {t.task_id: t for t in tasks if tenant is None or t.tenant == tenant}
    calls = [
        a
        for a in attempts
        if _in_window(utc(a.started_at), since, until) and (tenant is None or a.tenant == tenant)
    ]
    in_window = [t for t in all_tasks.values() if _in_window(task_time(t), since, until)]
    counted = in_window if count_sub_agents else [t for t in in_window if not t.parent_task_id]
    return _Window(all_tasks, calls, in_window, counted, count_sub_agents)


def _group_rows(
    attempts: list[AttemptRecord],
    tasks: list[TaskRecord],
    call_key: Callable[[AttemptRecord], str],
    task_keys: Callable[[TaskRecord], Iterable[str]],
) -> list[GroupRow]:
    spend: dict[str, Spend] = defaultdict(Spend)
    counts: dict[str, TaskCounts] = defaultdict(TaskCounts)
    for a in attempts:
        spend[call_key(a)].add(a)
    for t in tasks:
        for k in task_keys(t):
            counts[k].add(t)
    rows = []
    for key in sorted(set(spend) | set(counts)):
        s, c = spend.get(key, Spend()), counts.get(key, TaskCounts())
        spent = s.model_dump(exclude={"served_prompt_tokens", "served_cached_tokens"})
        rows.append(
            GroupRow(
                key=key,
                **spent,
                **c.model_dump(),
                cost_per_successful_task_usd=ratio(s.total_cost_usd, c.tasks_succeeded),
                cache_hit_ratio=s.cache_hit_ratio,
            )
        )
    rows.sort(key=lambda r: (-r.total_cost_usd, r.key))
    return rows


def _groupings(w: _Window) -> dict[str, list[GroupRow]]:
    """The rows of every grouping. Model, GPU and adapter: a task counts in every group its calls touched."""

    def agent_of(a: AttemptRecord) -> str:
        # a sub-agent's calls count for the agent whose goal it serves (one goal, one agent)
        task = w.owner(a)
        return (task.agent if task else None) or a.agent or NONE_KEY

    def model_of(a: AttemptRecord) -> str:
        return a.model_served or a.model_requested or NONE_KEY

    def gpu_of(a: AttemptRecord) -> str:
        return a.gpu or NONE_KEY

    def adapter_of(a: AttemptRecord) -> str:
        return a.adapter or BASE_MODEL_KEY

    keyers = {"model": model_of, "gpu": gpu_of, "adapter": adapter_of}
    touched: dict[str, dict[str, set[str]]] = {name: defaultdict(set) for name in keyers}
    for a in w.calls:
        task = w.owner(a)
        if task is not None:
            for name, key_of in keyers.items():
                touched[name][task.task_id].add(key_of(a))

    calls, tasks = w.calls, w.tasks
    groups_by = {
        "agent": _group_rows(calls, tasks, agent_of, lambda t: [t.agent or NONE_KEY]),
        "tenant": _group_rows(calls, tasks, lambda a: a.tenant, lambda t: [t.tenant]),
        "model": _group_rows(calls, tasks, model_of, lambda t: touched["model"].get(t.task_id, ())),
        "gpu": _group_rows(calls, tasks, gpu_of, lambda t: touched["gpu"].get(t.task_id, ())),
        "day": _group_rows(calls, tasks, lambda a: _day(a.started_at), lambda t: [_day(task_time(t))]),
        "adapter": _group_rows(calls, tasks, adapter_of, lambda t: touched["adapter"].get(t.task_id, ())),
    }
    groups_by["day"].sort(key=lambda r: r.key)
    return groups_by


def _totals(w: _Window, counts: TaskCounts, spend: Spend) -> dict[str, Any]:
    """The report's counts, totals and unit costs."""
    tasks_by_status: dict[str, int] = defaultdict(int)
    for t in w.tasks:
        tasks_by_status[t.status.value] += 1
    calls_by_outcome: dict[str, int] = defaultdict(int)
    for a in w.calls:
        calls_by_outcome[a.outcome.value] += 1
    cost_per_token = ratio(spend.total_cost_usd, spend.prompt_tokens + spend.completion_tokens)
    return dict(
        **counts.model_dump(),
        tasks_by_status=dict(sorted(tasks_by_status.items())),
        calls=spend.calls,
        calls_by_outcome=dict(sorted(calls_by_outcome.items())),
        prompt_tokens=spend.prompt_tokens,
        cached_tokens=spend.cached_tokens,
        completion_tokens=spend.completion_tokens,
        gpu_seconds=spend.gpu_seconds,
        total_cost_usd=spend.total_cost_usd,
        cost_per_successful_task_usd=ratio(spend.total_cost_usd, counts.tasks_succeeded),
        cost_per_token_usd=cost_per_token,
        cost_per_million_tokens_usd=None if cost_per_token is None else cost_per_token * 1e6,
        cost_per_request_usd=ratio(spend.total_cost_usd, spend.calls),
        cache_hit_ratio=spend.cache_hit_ratio,
    )


def build_report(
    attempts: Iterable[AttemptRecord],
    tasks: Iterable[TaskRecord],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    tenant: str | None = None,
    group_by: str = "tenant",
    now: datetime | None = None,
    count_sub_agents: bool = False,
) -> Report:
    """Compute the report over ``[since, until)``.

    ``attempts`` counted: those started in the window. ``tasks`` counted: the goals (tasks
    without a parent) that ended in the window (running ones: started in it); tasks outside
    the window may be passed too, so attempts can find their goal's status for the waste
    breakdown. A sub-agent's calls count for its goal's agent; with ``count_sub_agents``
    each sub-agent's task counts as a task of its own, under its own agent with its own calls.
    """
    if group_by not in GROUP_BY:
        raise ValueError(f"unknown group-by {group_by!r}; use one of {', '.join(GROUP_BY)}")
    since, until = utc(since), utc(until)
    w = _select(attempts, tasks, since, until, tenant, count_sub_agents)
    counts, spend = TaskCounts(), Spend()
    for t in w.tasks:
        counts.add(t)
    for a in w.calls:
        spend.add(a)
    groups_by = _groupings(w)
    bucket_s, points = timeline(w.calls, w.tasks, since, until)
    return Report(
        generated_at=utc(now) or datetime.now(UTC),
        since=since,
        until=until,
        tenant=tenant,
        group_by=group_by,
        count_sub_agents=count_sub_agents,
        sub_agent_tasks=sum(1 for t in w.in_window if t.parent_task_id),
        **_totals(w, counts, spend),
        waste=waste_of(w.calls, w.root_task, spend.total_cost_usd),
        groups=groups_by[group_by],
        groups_by=groups_by,
        timeline_bucket_s=bucket_s,
        timeline=points,
        failed_tasks=_failed(w.tasks),
    )


def _failed(tasks: list[TaskRecord]) -> list[FailedTask]:
    ended = [t for t in tasks if t.status in WASTED_TASK]
    ended.sort(key=lambda t: (task_time(t), t.task_id), reverse=True)
    return [
        FailedTask(task_id=t.task_id, agent=t.agent, tenant=t.tenant, status=t.status.value, error=t.error,
                   cost_usd=t.cost_usd, finished_at=utc(t.finished_at))
        for t in ended[:MAX_FAILED_LISTED]
    ]
