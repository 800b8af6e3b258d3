"""A deterministic fleet of task and attempt records with every case the report must handle,
and an independent hand computation of the headline (no code shared with compute.py)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from taskplane.store.records import AttemptRecord, Outcome, TaskRecord, TaskStatus

T0 = datetime(2031, 3, 4, 9, 0, tzinfo=UTC)
SINCE = T0
UNTIL = T0 + timedelta(hours=2)
TENANTS = ("acme", "globex", "initech")
AGENTS = ("triage", "fixer", "summarise")
STATUSES = (
    TaskStatus.SUCCEEDED,
    TaskStatus.SUCCEEDED,
    TaskStatus.SUCCEEDED,
    TaskStatus.FAILED,
    TaskStatus.FAILED_DEADLINE,
    TaskStatus.CANCELLED,
    TaskStatus.SUCCEEDED,  # late (deadline_met False)
    TaskStatus.RUNNING,
)


def fleet(n_tasks: int = 40, seed: int = 7) -> tuple[list[AttemptRecord], list[TaskRecord]]:
    """Tasks inside [SINCE, UNTIL) plus a few before and after, with retries, shed and cached calls."""
    rng = random.Random(seed)
    attempts: list[AttemptRecord] = []
    tasks: list[TaskRecord] = []
    for k in range(n_tasks):
        tid = f"task-{k:03d}"
        tenant, agent = TENANTS[k % 3], AGENTS[k % len(AGENTS)]
        status = STATUSES[k % len(STATUSES)]
        late = k % len(STATUSES) == 6
        # two tasks before the window, two after
        offset = timedelta(minutes=-30) if k < 2 else timedelta(hours=3) if k >= n_tasks - 2 else timedelta(minutes=2 * k)
        start = T0 + offset
        context = rng.randint(200, 800)
        for step in range(rng.randint(2, 5)):
            tries = 2 if rng.random() < 0.2 else 1
            for attempt in range(1, tries + 1):
                outcome = Outcome.SUCCESS
                if attempt < tries:
                    outcome = rng.choice([Outcome.ERROR, Outcome.TIMEOUT])
                elif rng.random() < 0.05:
                    outcome = Outcome.SHED
                elif rng.random() < 0.05:
                    outcome = Outcome.CACHED
                cached = 0 if step == 0 or rng.random() < 0.3 else max(context - rng.randint(50, 300), 0)
                cost = 0.0 if outcome in (Outcome.SHED, Outcome.CACHED) else round(rng.uniform(0.0005, 0.004), 6)
                attempts.append(
                    AttemptRecord(
                        attempt_key=f"{tid}:s{step}:a{attempt}",
                        task_id=tid,
                        step=step,
                        attempt=attempt,
                        session_id=tid,
                        tenant=tenant,
                        agent=agent,
                        model_requested="llama-3.1-8b",
                        model_served="llama-3.1-8b" if rng.random() < 0.8 else "llama-3.2-1b",
                        replica=f"r{rng.randint(0, 3)}",
                        gpu=rng.choice(["h100", "l40s"]),
                        prompt_tokens=context,
                        cached_tokens=min(cached, context),
                        completion_tokens=rng.randint(20, 200),
                        queue_ms=rng.uniform(0, 30),
                        ttft_ms=rng.uniform(40, 200),
                        total_ms=rng.uniform(300, 2000),
                        gpu_seconds=cost * 1440,
                        price_version=1,
                        cost_usd=cost,
                        outcome=outcome,
                        error_type=None if outcome is Outcome.SUCCESS else outcome.value,
                        started_at=start + timedelta(seconds=20 * step + attempt),
                    )
                )
            context += rng.randint(100, 400)
        finished = None if status is TaskStatus.RUNNING else start + timedelta(seconds=150)
        tasks.append(
            TaskRecord(
                task_id=tid,
                agent=agent,
                tenant=tenant,
                priority="standard",
                status=status,
                deadline=start + timedelta(minutes=5),
                deadline_met=None if status is TaskStatus.RUNNING else (status is TaskStatus.SUCCEEDED and not late),
                started_at=start,
                finished_at=finished,
                cost_usd=0.0,
                attempts=0,
                retries=0,
            )
        )
    # spend outside any task (a plain OpenAI client through the gateway)
    attempts.append(
        AttemptRecord(attempt_key="no-task-1", tenant="acme", model_requested="llama-3.1-8b", gpu="h100",
                      prompt_tokens=100, completion_tokens=10, cost_usd=0.0123, started_at=T0 + timedelta(minutes=5))
    )
    return attempts, tasks


def in_window(t: datetime | None, since: datetime | None, until: datetime | None) -> bool:
    return t is not None and (since is None or t >= since) and (until is None or t < until)


def hand_headline(
    attempts: list[AttemptRecord],
    tasks: list[TaskRecord],
    since: datetime | None = SINCE,
    until: datetime | None = UNTIL,
    tenant: str | None = None,
) -> tuple[float, int, int, float]:
    """(total cost, tasks succeeded within deadline, tasks failed, cost per successful task) by hand."""
    total = sum(a.cost_usd for a in attempts if in_window(a.started_at, since, until) and tenant in (None, a.tenant))
    ok = failed = 0
    for t in tasks:
        if tenant not in (None, t.tenant) or not in_window(t.finished_at or t.started_at, since, until):
            continue
        if t.status is TaskStatus.SUCCEEDED and t.deadline_met is not False:
            ok += 1
        elif t.status in (TaskStatus.FAILED, TaskStatus.FAILED_DEADLINE):
            failed += 1
    return total, ok, failed, total / ok
