"""The task row of a task no worker ran, written by the client that found out.

A worker writes every row it can, including for agents it does not serve (the catch-all
in :mod:`taskplane.sdk.unserved`). When no worker polls the queue at all, or a task timed
out with no worker running it, only the client knows: it closes the task's row itself, so
"cost per successful task" counts the failure. Best effort: without a database (none named
by ``TASKPLANE_DATABASE_URL`` or the dev stack) or with Postgres down, it logs and moves on.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import structlog
from temporalio.client import WorkflowHandle

from taskplane import temporal_names as tn
from taskplane.sdk.resolve import find_database_url

log = structlog.get_logger("taskplane.sdk")


async def record_unrun_task(handle: WorkflowHandle[Any, Any], status: str, error: str,
                            database_url: str | None = None) -> bool:
    """Close the row of the task behind ``handle`` as ``status`` with ``error``; True if written."""
    from taskplane.store import repo
    from taskplane.store.db import create_engine
    from taskplane.store.records import TaskRecord, TaskStatus

    url = database_url or find_database_url()
    if not url:
        log.info("task_row_skipped", task_id=handle.id, reason="no database configured")
        return False
    try:
        desc = await handle.describe()
        memo = await desc.memo()
        sa = desc.typed_search_attributes
        record = TaskRecord(
            task_id=handle.id, agent=sa.get(tn.AGENT) or desc.workflow_type,
            tenant=str(memo.get("tenant") or sa.get(tn.TENANT) or "default"),
            priority=str(memo.get("priority") or "standard"), status=TaskStatus(status),
            deadline=sa.get(tn.DEADLINE), deadline_met=False, started_at=desc.start_time,
            finished_at=desc.close_time or datetime.now(UTC), error=error[:2000],
            parent_task_id=memo.get("parent_task_id"),
        )
        engine = create_engine(url, pool_size=1)
        try:
            written = await repo.close_unrun_task(engine, record)
        finally:
            await engine.dispose()
    except Exception as exc:  # bookkeeping never hides the task's own outcome
        log.warning("task_row_not_recorded", task_id=handle.id, error=str(exc))
        return False
    log.info("task_row", task_id=handle.id, status=status, by="client", written=written)
    return written
