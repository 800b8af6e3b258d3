"""The report's timeline: spend, successes and cache hits per time bucket, the bucket size
chosen so the window gives at most ``MAX_BUCKETS`` of them."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from taskplane.reports.model import TimePoint
from taskplane.reports.tally import Spend, ratio, task_time, utc
from taskplane.store.records import AttemptRecord, TaskRecord, TaskStatus

#: Timeline bucket sizes, smallest first; the first giving <= MAX_BUCKETS buckets is used.
BUCKETS_S = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
MAX_BUCKETS = 60


def _bucket_size(start: datetime, end: datetime) -> int:
    span = max((end - start).total_seconds(), 1.0)
    for size in BUCKETS_S:
        if span / size <= MAX_BUCKETS:
            return size
    return BUCKETS_S[-1]


def _bucket(t: datetime, size: int) -> datetime:
    ts = utc(t).timestamp()  # type: ignore[union-attr]
    return datetime.fromtimestamp(ts - ts % size, tz=UTC)


def timeline(
    calls: list[AttemptRecord],
    tasks: list[TaskRecord],
    since: datetime | None,
    until: datetime | None,
) -> tuple[int, list[TimePoint]]:
    """The bucket size in seconds and the buckets, oldest first (0 and none without records)."""
    times = [utc(a.started_at) for a in calls] + [task_time(t) for t in tasks]
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
        p.cost_per_successful_task_usd = ratio(p.total_cost_usd, p.tasks_succeeded)
        p.cumulative_cost_per_successful_task_usd = ratio(cost, done)
        p.cache_hit_ratio = served[p.start].cache_hit_ratio if p.start in served else None
    return size, ordered
