"""Rows for attempts a killed gateway left in flight at a replica.

Before an attempt is sent, the gateway notes it in the outbox's in-flight journal
(``store/inflight.py``) with everything its row would say that is known at dispatch.
If the process is SIGKILLed before the row is written, the next gateway on the same
outbox finds the note and records the attempt as ``outcome=error``,
``error_type=gateway_lost``, under the very attempt_key the attempt would have had: if
its real row made it after all, that row wins (Postgres ``ON CONFLICT DO NOTHING``).

How long the replica worked on it is unknown. The estimate is conservative (it never
charges time the gateway cannot vouch for): from dispatch to the dead process's last
outbox commit or heartbeat (at most ``heartbeat_s``, 1 s, before the crash while attempts
are open), capped by the call's ``request_timeout_s``, shared by the batch the replica
ran when the attempt started, priced at the replica's hourly price (docs/costs.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from pydantic import BaseModel, ValidationError

from taskplane.calls import costing
from taskplane.store.inflight import Orphan
from taskplane.store.records import AttemptRecord

log = structlog.get_logger(__name__)


class AttemptNote(BaseModel):
    """An attempt as known when it is sent: enough to write its row if the gateway dies."""

    record: AttemptRecord  # outcome error / gateway_lost, prompt tokens, zero cost so far
    timeout_s: float  # the call's upstream timeout: no attempt runs longer
    price_per_hour_usd: float  # the replica's price at dispatch
    batch_at_start: int  # calls in flight on the replica, this one included


def lost_attempt(note: AttemptNote, orphan: Orphan) -> AttemptRecord:
    """The row of an attempt whose gateway died: GPU time from dispatch to the process's
    last sign of life, capped by the timeout (see the module docstring)."""
    started = note.record.started_at.timestamp()
    elapsed_s = min(max(orphan.last_alive - started, 0.0), note.timeout_s)
    gpu_s = costing.gpu_seconds(elapsed_s, note.batch_at_start, note.batch_at_start)
    return note.record.model_copy(update={
        "total_ms": elapsed_s * 1000.0,
        "gpu_seconds": gpu_s,
        "cost_usd": costing.cost_usd(gpu_s, note.price_per_hour_usd),
    })


async def record_orphans(sink: Any, write: Callable[[AttemptRecord], Awaitable[None]]) -> list[AttemptRecord]:
    """Record every attempt the previous process on ``sink``'s outbox left in flight.
    Writing the row closes its note, so each is recorded once, even across restarts."""
    orphans: list[Orphan] = getattr(sink, "orphaned_attempts", list)()
    records = []
    for orphan in orphans:
        try:
            note = AttemptNote.model_validate_json(orphan.payload)
        except ValidationError as exc:  # a note from an incompatible version: keep it, say so
            log.error("unreadable in-flight note left in the outbox", attempt_key=orphan.key, error=str(exc)[:200])
            continue
        records.append(lost_attempt(note, orphan))
    await asyncio.gather(*(write(r) for r in records))  # one group commit
    if records:
        log.warning("recorded attempts lost with a previous gateway", count=len(records),
                    cost_usd=round(sum(r.cost_usd for r in records), 6))
    return records

