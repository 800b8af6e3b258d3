"""Record factories shared by the store tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from taskplane.store.records import AttemptRecord, TaskRecord, TaskStatus

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def attempt(i: int, task: str = "task-1", **kw: object) -> AttemptRecord:
    data: dict[str, object] = {
        "attempt_key": f"{task}:call-{i}:try-1",
        "task_id": task,
        "step": i,
        "tenant": "acme",
        "agent": "triage",
        "model_requested": "llama-3.1-8b",
        "model_served": "llama-3.1-8b",
        "replica": "r1",
        "gpu": "h100",
        "prompt_tokens": 100 + i,
        "cached_tokens": 50,
        "completion_tokens": 20,
        "total_ms": 300.0,
        "ttft_ms": 80.0,
        "gpu_seconds": 0.05,
        "cost_usd": 0.001 * (i + 1),
        "started_at": T0 + timedelta(seconds=i),
    }
    data.update(kw)
    return AttemptRecord.model_validate(data)


def task(task_id: str = "task-1", status: TaskStatus = TaskStatus.RUNNING, **kw: object) -> TaskRecord:
    data: dict[str, object] = {
        "task_id": task_id,
        "agent": "triage",
        "tenant": "acme",
        "status": status,
        "started_at": T0,
        "deadline": T0 + timedelta(minutes=5),
    }
    data.update(kw)
    return TaskRecord.model_validate(data)
