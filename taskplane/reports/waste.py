"""Where money went without producing a successful task: the report's waste breakdown.

Categories are disjoint, first match wins: the spend of a goal that failed, then shed
work, then retried attempts; a useful call may still have re-prefilled context its session
had already built (the estimated cache-miss waste).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from itertools import pairwise

from taskplane.reports.model import Waste
from taskplane.reports.tally import ratio, utc
from taskplane.store.records import AttemptRecord, Outcome, TaskRecord, TaskStatus

#: Statuses whose whole spend is waste.
WASTED_TASK = frozenset({TaskStatus.FAILED, TaskStatus.FAILED_DEADLINE, TaskStatus.CANCELLED})
#: Attempts that did not produce the answer and had to be retried (or gave up).
FAILED_ATTEMPT = frozenset({Outcome.ERROR, Outcome.TIMEOUT, Outcome.CANCELLED})


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
        calls.sort(key=lambda c: (utc(c.started_at), c.attempt_key))
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


def waste_of(calls: list[AttemptRecord], goal_of: Callable[[str | None], TaskRecord | None],
             total_cost_usd: float) -> Waste:
    """The breakdown over ``calls``; ``goal_of`` maps a call's task id to the goal it serves."""
    waste = Waste()
    prev = previous_context(calls)
    for a in calls:
        cat = waste_category(a, goal_of(a.task_id))
        if cat == "failed_task":
            waste.failed_tasks_usd += a.cost_usd
        elif cat == "shed":
            waste.shed_usd += a.cost_usd
        elif cat == "retry":
            waste.retries_usd += a.cost_usd
        else:
            waste.cache_miss_usd += cache_miss_usd(a, prev.get(a.attempt_key))
    waste.total_usd = waste.failed_tasks_usd + waste.retries_usd + waste.shed_usd + waste.cache_miss_usd
    waste.share_of_spend = ratio(waste.total_usd, total_cost_usd)
    return waste
