"""The cost report, computed from plain records (live Postgres rows and simulated runs alike).

The headline is cost per successful task, fully loaded: every dollar spent in the
window (failed tasks, retries and shed work included) divided by the tasks that
succeeded within their deadline. Next to it stand the naive figures (cost per token,
cost per request) so the gap is visible, and a waste breakdown that says where the
difference went. The SQL views of migration 0002 compute the same numbers; keep the
two in step (docs/costs.md has the definitions).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from itertools import pairwise
from typing import Literal

from pydantic import BaseModel, Field

from taskplane.store.records import AttemptRecord, Outcome, TaskRecord, TaskStatus

GroupBy = Literal["agent", "tenant", "model", "gpu", "day"]
GROUP_BY: tuple[str, ...] = ("agent", "tenant", "model", "gpu", "day")
NONE_KEY = "(none)"

#: Statuses whose whole spend is waste.
WASTED_TASK = frozenset({TaskStatus.FAILED, TaskStatus.FAILED_DEADLINE, TaskStatus.CANCELLED})
#: Attempts that did not produce the answer and had to be retried (or gave up).
FAILED_ATTEMPT = frozenset({Outcome.ERROR, Outcome.TIMEOUT, Outcome.CANCELLED})

#: Timeline bucket sizes, smallest first; the first giving <= MAX_BUCKETS buckets is used.
BUCKETS_S = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
MAX_BUCKETS = 60


class TaskCounts(BaseModel):
    tasks_total: int = 0
    tasks_succeeded: int = Field(default=0, description="succeeded within the deadline: the headline's divisor")
    tasks_succeeded_late: int = Field(default=0, description="status succeeded but the deadline was missed")
    tasks_failed: int = Field(default=0, description="failed or failed-deadline")
    tasks_cancelled: int = 0
    tasks_running: int = 0

    def add(self, task: TaskRecord) -> None:
        self.tasks_total += 1
        if task.status is TaskStatus.SUCCEEDED:
            if task.deadline_met is False:
                self.tasks_succeeded_late += 1
            else:
                self.tasks_succeeded += 1
        elif task.status in (TaskStatus.FAILED, TaskStatus.FAILED_DEADLINE):
            self.tasks_failed += 1
        elif task.status is TaskStatus.CANCELLED:
            self.tasks_cancelled += 1
        else:
            self.tasks_running += 1


class Spend(BaseModel):
    calls: int = 0
    total_cost_usd: float = 0.0
    gpu_seconds: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    served_prompt_tokens: int = Field(default=0, description="prompt tokens of successful calls")
    served_cached_tokens: int = Field(default=0, description="cached tokens of successful calls")

    def add(self, a: AttemptRecord) -> None:
        self.calls += 1
        self.total_cost_usd += a.cost_usd
        self.gpu_seconds += a.gpu_seconds
        self.prompt_tokens += a.prompt_tokens
        self.cached_tokens += a.cached_tokens
        self.completion_tokens += a.completion_tokens
        if a.outcome is Outcome.SUCCESS:
            self.served_prompt_tokens += a.prompt_tokens
            self.served_cached_tokens += a.cached_tokens

    @property
    def cache_hit_ratio(self) -> float | None:
        return _ratio(self.served_cached_tokens, self.served_prompt_tokens)


class GroupRow(BaseModel):
    """One key of a grouping (an agent, a tenant, a model, a GPU, a day)."""

    key: str
    tasks_total: int = 0
    tasks_succeeded: int = 0
    tasks_succeeded_late: int = 0
    tasks_failed: int = 0
    tasks_cancelled: int = 0
    tasks_running: int = 0
    calls: int = 0
    total_cost_usd: float = 0.0
    gpu_seconds: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_per_successful_task_usd: float | None = None
    cache_hit_ratio: float | None = None


class Waste(BaseModel):
    """Where money went without producing a successful task. Categories are disjoint."""

    failed_tasks_usd: float = Field(default=0.0, description="all spend of tasks that failed, missed the deadline or were cancelled")
    retries_usd: float = Field(default=0.0, description="attempts that errored, timed out or were cancelled, in other tasks")
    shed_usd: float = Field(default=0.0, description="attempts shed by admission control, in other tasks")
    cache_miss_usd: float = Field(default=0.0, description="estimated prefill of context the session had already built")
    total_usd: float = 0.0
    share_of_spend: float | None = None


class TimePoint(BaseModel):
    start: datetime
    calls: int = 0
    total_cost_usd: float = 0.0
    tasks_succeeded: int = 0
    cost_per_successful_task_usd: float | None = None
    cumulative_cost_per_successful_task_usd: float | None = None
    cache_hit_ratio: float | None = None


class FailedTask(BaseModel):
    """A task that ended without success, for the report's list of what to look at."""

    task_id: str
    agent: str
    tenant: str
    status: str
    error: str | None = None
    cost_usd: float = 0.0
    finished_at: datetime | None = None


#: The report lists at most this many failed tasks (the latest first).
MAX_FAILED_LISTED = 50


class Report(BaseModel):
    """The cost report. ``model_dump(mode="json")`` (minus ``groups_by``) is the JSON format."""

    generated_at: datetime
    since: datetime | None = None
    until: datetime | None = None
    tenant: str | None = None
    group_by: str = "tenant"
    count_sub_agents: bool = Field(default=False, description="sub-agents' tasks counted as tasks of their own")
    sub_agent_tasks: int = Field(default=0, description="sub-agents' tasks in the window (counted or not)")

    tasks_total: int = 0
    tasks_succeeded: int = 0
    tasks_succeeded_late: int = 0
    tasks_failed: int = 0
    tasks_cancelled: int = 0
    tasks_running: int = 0
    tasks_by_status: dict[str, int] = Field(default_factory=dict)

    calls: int = 0
    calls_by_outcome: dict[str, int] = Field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    gpu_seconds: float = 0.0

    total_cost_usd: float = 0.0
    cost_per_successful_task_usd: float | None = None
    cost_per_token_usd: float | None = None
    cost_per_million_tokens_usd: float | None = None
    cost_per_request_usd: float | None = None
    cache_hit_ratio: float | None = None
    # provisioned replica-hours (fleet_hours rows, idle included) in the window, when an
    # autoscaler records them: provisioned_gpu_hours, idle_gpu_hours, fleet_cost_usd,
    # fleet_cost_per_successful_task_usd (the fully loaded figure)
    fleet: dict[str, float | None] | None = None

    waste: Waste = Field(default_factory=Waste)
    groups: list[GroupRow] = Field(default_factory=list)
    groups_by: dict[str, list[GroupRow]] = Field(default_factory=dict)
    timeline_bucket_s: int = 0
    timeline: list[TimePoint] = Field(default_factory=list)
    failed_tasks: list[FailedTask] = Field(default_factory=list, description="the latest tasks that did not succeed")

    def to_json_dict(self) -> dict[str, object]:
        """The JSON report (DESIGN.md contract: tasks_succeeded, tasks_failed, total_cost_usd,
        cost_per_successful_task_usd), with groups for ``group_by`` only."""
        return self.model_dump(mode="json", exclude={"groups_by"})


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _in_window(t: datetime | None, since: datetime | None, until: datetime | None) -> bool:
    if t is None:
        return False
    return (since is None or t >= since) and (until is None or t < until)


def task_time(task: TaskRecord) -> datetime:
    """When a task counts: when it ended, or when it started if it still runs."""
    return _utc(task.finished_at or task.started_at)  # type: ignore[return-value]


def _day(t: datetime) -> str:
    return _utc(t).date().isoformat()  # type: ignore[union-attr]


def waste_category(a: AttemptRecord, task: TaskRecord | None) -> str:
    """``failed_task``, ``shed``, ``retry`` or ``useful`` (first match wins)."""
    if task is not None and task.status in WASTED_TASK:
        return "failed_task"
    if a.outcome is Outcome.SHED:
        return "shed"
    if a.outcome in FAILED_ATTEMPT:
        return "retry"
    return "useful"


def prefill_fraction(a: AttemptRecord) -> float:
    """The share of a call's cost spent on prefill: from its timings, else from token counts."""
    uncached = max(a.prompt_tokens - a.cached_tokens, 0)
    if a.ttft_ms is not None and a.total_ms > a.queue_ms:
        return min(max((a.ttft_ms - a.queue_ms) / (a.total_ms - a.queue_ms), 0.0), 1.0)
    den = uncached + a.completion_tokens
    return uncached / den if den else 0.0


def previous_context(attempts: Iterable[AttemptRecord]) -> dict[str, int]:
    """For each successful call with a predecessor in its session: prompt + completion tokens of
    the previous successful call, i.e. the context the session had already built."""
    sessions: dict[str, list[AttemptRecord]] = defaultdict(list)
    for a in attempts:
        key = a.session_id or a.task_id
        if a.outcome is Outcome.SUCCESS and key is not None:
            sessions[key].append(a)
    prev: dict[str, int] = {}
    for calls in sessions.values():
        calls.sort(key=lambda c: (_utc(c.started_at), c.attempt_key))
        for before, after in pairwise(calls):
            prev[after.attempt_key] = before.prompt_tokens + before.completion_tokens
    return prev


def cache_miss_usd(a: AttemptRecord, prev_context_tokens: int | None) -> float:
    """Estimated cost of re-prefilling context the session had already built (0 if none)."""
    uncached = max(a.prompt_tokens - a.cached_tokens, 0)
    if a.outcome is not Outcome.SUCCESS or uncached <= 0 or prev_context_tokens is None:
        return 0.0
    missed = max(min(a.prompt_tokens, prev_context_tokens) - a.cached_tokens, 0)
    return a.cost_usd * prefill_fraction(a) * missed / uncached


def _bucket_size(start: datetime, end: datetime) -> int:
    span = max((end - start).total_seconds(), 1.0)
    for size in BUCKETS_S:
        if span / size <= MAX_BUCKETS:
            return size
    return BUCKETS_S[-1]


def _bucket(t: datetime, size: int) -> datetime:
    ts = _utc(t).timestamp()  # type: ignore[union-attr]
    return datetime.fromtimestamp(ts - ts % size, tz=UTC)


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
                cost_per_successful_task_usd=_ratio(s.total_cost_usd, c.tasks_succeeded),
                cache_hit_ratio=s.cache_hit_ratio,
            )
        )
    rows.sort(key=lambda r: (-r.total_cost_usd, r.key))
    return rows


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
    since, until = _utc(since), _utc(until)
    all_tasks = {t.task_id: t for t in tasks if tenant is None or t.tenant == tenant}
    calls = [
        a
        for a in attempts
        if _in_window(_utc(a.started_at), since, until) and (tenant is None or a.tenant == tenant)
    ]
    in_window = [t for t in all_tasks.values() if _in_window(task_time(t), since, until)]
    window_tasks = in_window if count_sub_agents else [t for t in in_window if not t.parent_task_id]

    def root_task(task_id: str | None) -> TaskRecord | None:
        """The goal an attempt belongs to: its task's root; for a sub-agent without a row of its
        own (rows written before sub-agents had them), the longest ``<goal id>.`` prefix."""
        tid = task_id or ""
        while tid:
            found = all_tasks.get(tid)
            if found is not None:
                return all_tasks.get(found.root_task_id, found) if found.root_task_id else found
            tid = tid.rpartition(".")[0]
        return None

    def owner(a: AttemptRecord) -> TaskRecord | None:
        """The counted task an attempt's spend goes to: its goal, or its own task when
        sub-agents count as tasks."""
        return all_tasks.get(a.task_id or "") if count_sub_agents else root_task(a.task_id)

    counts, spend = TaskCounts(), Spend()
    for t in window_tasks:
        counts.add(t)
    for a in calls:
        spend.add(a)
    total_tokens = spend.prompt_tokens + spend.completion_tokens

    # Waste: disjoint categories, first match wins (failed task > shed > retry).
    waste = Waste()
    prev = previous_context(calls)
    for a in calls:
        cat = waste_category(a, root_task(a.task_id))
        if cat == "failed_task":
            waste.failed_tasks_usd += a.cost_usd
        elif cat == "shed":
            waste.shed_usd += a.cost_usd
        elif cat == "retry":
            waste.retries_usd += a.cost_usd
        else:
            waste.cache_miss_usd += cache_miss_usd(a, prev.get(a.attempt_key))
    waste.total_usd = waste.failed_tasks_usd + waste.retries_usd + waste.shed_usd + waste.cache_miss_usd
    waste.share_of_spend = _ratio(waste.total_usd, spend.total_cost_usd)

    # Groupings. Model and GPU: a task counts in every group its calls touched.
    def agent_of(a: AttemptRecord) -> str:
        # a sub-agent's calls count for the agent whose goal it serves (one goal, one agent)
        task = owner(a)
        return (task.agent if task else None) or a.agent or NONE_KEY

    def model_of(a: AttemptRecord) -> str:
        return a.model_served or a.model_requested or NONE_KEY

    def gpu_of(a: AttemptRecord) -> str:
        return a.gpu or NONE_KEY

    touched: dict[str, dict[str, set[str]]] = {"model": defaultdict(set), "gpu": defaultdict(set)}
    for a in calls:
        task = owner(a)
        if task is not None:
            touched["model"][task.task_id].add(model_of(a))
            touched["gpu"][task.task_id].add(gpu_of(a))

    groups_by = {
        "agent": _group_rows(calls, window_tasks, agent_of, lambda t: [t.agent or NONE_KEY]),
        "tenant": _group_rows(calls, window_tasks, lambda a: a.tenant, lambda t: [t.tenant]),
        "model": _group_rows(calls, window_tasks, model_of, lambda t: touched["model"].get(t.task_id, ())),
        "gpu": _group_rows(calls, window_tasks, gpu_of, lambda t: touched["gpu"].get(t.task_id, ())),
        "day": _group_rows(calls, window_tasks, lambda a: _day(a.started_at), lambda t: [_day(task_time(t))]),
    }
    groups_by["day"].sort(key=lambda r: r.key)

    bucket_s, timeline = _timeline(calls, window_tasks, since, until)

    tasks_by_status: dict[str, int] = defaultdict(int)
    for t in window_tasks:
        tasks_by_status[t.status.value] += 1
    calls_by_outcome: dict[str, int] = defaultdict(int)
    for a in calls:
        calls_by_outcome[a.outcome.value] += 1

    cost_per_token = _ratio(spend.total_cost_usd, total_tokens)
    return Report(
        generated_at=_utc(now) or datetime.now(UTC),
        since=since,
        until=until,
        tenant=tenant,
        group_by=group_by,
        count_sub_agents=count_sub_agents,
        sub_agent_tasks=sum(1 for t in in_window if t.parent_task_id),
        **counts.model_dump(),
        tasks_by_status=dict(sorted(tasks_by_status.items())),
        calls=spend.calls,
        calls_by_outcome=dict(sorted(calls_by_outcome.items())),
        prompt_tokens=spend.prompt_tokens,
        cached_tokens=spend.cached_tokens,
        completion_tokens=spend.completion_tokens,
        gpu_seconds=spend.gpu_seconds,
        total_cost_usd=spend.total_cost_usd,
        cost_per_successful_task_usd=_ratio(spend.total_cost_usd, counts.tasks_succeeded),
        cost_per_token_usd=cost_per_token,
        cost_per_million_tokens_usd=None if cost_per_token is None else cost_per_token * 1e6,
        cost_per_request_usd=_ratio(spend.total_cost_usd, spend.calls),
        cache_hit_ratio=spend.cache_hit_ratio,
        waste=waste,
        groups=groups_by[group_by],
        groups_by=groups_by,
        timeline_bucket_s=bucket_s,
        timeline=timeline,
        failed_tasks=_failed(window_tasks),
    )


def _failed(tasks: list[TaskRecord]) -> list[FailedTask]:
    ended = [t for t in tasks if t.status in WASTED_TASK]
    ended.sort(key=lambda t: (task_time(t), t.task_id), reverse=True)
    return [
        FailedTask(task_id=t.task_id, agent=t.agent, tenant=t.tenant, status=t.status.value, error=t.error,
                   cost_usd=t.cost_usd, finished_at=_utc(t.finished_at))
        for t in ended[:MAX_FAILED_LISTED]
    ]


def _timeline(
    calls: list[AttemptRecord],
    tasks: list[TaskRecord],
    since: datetime | None,
    until: datetime | None,
) -> tuple[int, list[TimePoint]]:
    times = [_utc(a.started_at) for a in calls] + [task_time(t) for t in tasks]
    if not times:
        return 0, []
    start = since or min(t for t in times if t is not None)
    end = until or max(t for t in times if t is not None)
    if end < start:
        start, end = end, start
    size = _bucket_size(start, end)
    points: dict[datetime, TimePoint] = {}
    served: dict[datetime, Spend] = defaultdict(Spend)

    def point(t: datetime) -> TimePoint:
        b = _bucket(t, size)
        if b not in points:
            points[b] = TimePoint(start=b)
        return points[b]

    for a in calls:
        p = point(a.started_at)
        p.calls += 1
        p.total_cost_usd += a.cost_usd
        served[p.start].add(a)
    for t in tasks:
        p = point(task_time(t))
        if t.status is TaskStatus.SUCCEEDED and t.deadline_met is not False:
            p.tasks_succeeded += 1
    cost, done = 0.0, 0
    ordered = [points[k] for k in sorted(points)]
    for p in ordered:
        cost += p.total_cost_usd
        done += p.tasks_succeeded
        p.cost_per_successful_task_usd = _ratio(p.total_cost_usd, p.tasks_succeeded)
        p.cumulative_cost_per_successful_task_usd = _ratio(cost, done)
        p.cache_hit_ratio = served[p.start].cache_hit_ratio if p.start in served else None
    return size, ordered
