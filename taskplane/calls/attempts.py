"""Attempt bookkeeping: every attempt of a call becomes exactly one ``AttemptRecord``.

Served, failed, cancelled, shed or answered from the response cache, each attempt is
charged its share of the replica's GPU time (``costing``), counted in the gateway's
metrics and handed to the durable cost writer under a key that makes a retried
activity count once. Before an attempt is sent it is journalled, so a gateway killed
mid-attempt still leaves its row to the next one (``lost``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import structlog

from taskplane.calls import costing, lost
from taskplane.calls.intake import INT32_MAX, Call
from taskplane.calls.metrics import GatewayMetrics
from taskplane.calls.placement import Placer
from taskplane.calls.stalls import CLOCK
from taskplane.context import R_CACHED_TOKENS, R_COST, R_GPU, R_MODEL, R_QUEUE_MS, R_REPLICA
from taskplane.engines.replica import Lease, ReplicaState
from taskplane.errors import ErrorType, TaskplaneError
from taskplane.scheduler.types import Decision
from taskplane.store.records import GATEWAY_LOST, AttemptRecord, Outcome, Stored

log = structlog.get_logger(__name__)


def token_count(value: Any) -> int:
    """A usage count as the engine reported it, or 0 when it is not a count (a string, a
    negative or fractional number): a replica's bad bookkeeping must not cost the row."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value < 0:
        return 0
    if isinstance(value, float) and not value.is_integer():
        return 0
    return min(int(value), INT32_MAX)  # the column is int32: a bogus count must not dead-letter the row


class AttemptSink:
    """Where attempt records go (the durable cost writer); a no-op when none is set."""

    async def record_attempt(self, rec: AttemptRecord) -> Stored | None:  # pragma: no cover - interface
        """Store the row; where it went. ``RowNotStored`` when it could be stored nowhere."""
        return None

    def refusing(self) -> str | None:  # pragma: no cover - interface
        """Why rows cannot be stored right now (calls are then refused), else None."""
        return None

    async def open_attempt(self, attempt_key: str, note: str) -> None:  # pragma: no cover - interface
        """Note an attempt as in flight before it is sent; its ``record_attempt`` closes the note.
        A sink that leaves this as it is keeps no in-flight journal (nothing is noted)."""
        return None

    def open_attempt_soon(self, attempt_key: str, note: str) -> asyncio.Future[None]:
        """``open_attempt`` started now, not awaited: what to await for the note (a sink may
        queue it without a task, as the cost writer does)."""
        return asyncio.ensure_future(self.open_attempt(attempt_key, note))


@dataclass
class Attempt:
    """One try of a call on one replica: what its row and the placer's feedback need.
    Made by ``AttemptLifecycle.begin``, settled once by ``succeeded``/``failed``/``cancelled``."""

    call: Call
    decision: Decision
    replica: ReplicaState
    lease: Lease  # the attempt's place in the replica's in-flight counts
    try_index: int
    queue_ms: float
    model: str  # the model asked of the replica (a fallback, or the pool's)
    started: datetime  # wall clock, for the row
    t0: float  # stalls.CLOCK time, for its durations
    ttft_ms: float | None = None  # set when the first token came back
    settled: bool = False
    # disaggregated: the prompt's place on the prefill replica, given back at the first token
    prefill_lease: Lease | None = None

    @property
    def batch_start(self) -> int:
        """Calls in flight on the replica once this one was added."""
        return self.lease.batch_start

    @property
    def prefill_replica(self) -> str | None:
        """The replica that computed the prompt of a disaggregated attempt, else None."""
        return self.prefill_lease.replica.name if self.prefill_lease else None

    def elapsed_ms(self) -> float:
        """Milliseconds since the attempt began, less any stall of the gateway's own (``stalls``)."""
        return (CLOCK.now() - self.t0) * 1000.0


def attempt_key(tenant: str, call_id: str, attempt: int, try_index: int) -> str:
    """The row's idempotency key, scoped to the tenant: a call id is the client's to choose,
    so another tenant sending the same id first must not make this call's row a duplicate.
    The tenant is percent-encoded, so no tenant and call id pair reads as another."""
    return f"{quote(tenant, safe='')}/{call_id}:{attempt}:{try_index}"


def new_record(call: Call, *, try_index: int, replica: ReplicaState | None, outcome: Outcome, model_served: str | None,
               started: datetime, **fields: Any) -> AttemptRecord:
    """The row of one attempt, with what is known before it ran and any further ``fields``
    (passed to the constructor: each assignment afterwards costs a pydantic ``__setattr__``);
    its key is the idempotency key."""
    fields.setdefault("prompt_tokens", call.prompt_tokens)
    return AttemptRecord(
        attempt_key=attempt_key(call.ctx.tenant, call.call_id, call.ctx.attempt, try_index),
        task_id=call.ctx.task_id,
        step=call.ctx.step,
        attempt=call.ctx.attempt,
        session_id=call.ctx.session_key,
        tenant=call.ctx.tenant,
        agent=call.ctx.agent,
        model_requested=call.pool.model,
        adapter=call.request.adapter,
        model_served=model_served,
        replica=replica.name if replica else None,
        gpu=replica.config.gpu if replica else None,
        outcome=outcome,
        started_at=started,
        **fields,
    )


def response_headers(replica: ReplicaState, rec: AttemptRecord, queue_ms: float, model: str) -> dict[str, str]:
    """The taskplane response headers of a served attempt (DESIGN.md, Gateway HTTP)."""
    return {R_REPLICA: replica.name, R_GPU: replica.config.gpu, R_CACHED_TOKENS: str(rec.cached_tokens),
            R_QUEUE_MS: f"{queue_ms:.1f}", R_COST: f"{rec.cost_usd:.10g}", R_MODEL: model}


class AttemptLedger:
    """Builds, charges, counts and writes attempt rows, and tells the placer how attempts went."""

    def __init__(self, sink: AttemptSink, metrics: GatewayMetrics, placer: Placer, request_timeout_s: float) -> None:
        self.sink = sink
        self.metrics = metrics
        self.placer = placer
        self.request_timeout_s = request_timeout_s
        self._notes_failing = False
        self._notes: dict[str, asyncio.Future[None]] = {}  # attempt key -> its note being committed
        # a sink with no ``open_attempt`` of its own (no database, no outbox) has no journal to note in
        self.journal = (os.environ.get("TASKPLANE_INFLIGHT_JOURNAL", "1") not in ("0", "false", "no")
                        and type(sink).open_attempt is not AttemptSink.open_attempt)

    def note_open(self, a: Attempt) -> None:
        """Journal the attempt (fsynced) as it is sent, so a SIGKILL mid-attempt still leaves
        its row to the next gateway (``lost``). The note joins the outbox's next group
        commit while the request goes out: waiting for it cost each attempt ~80 ms of TTFT in
        a burst of 1,000 (docs/reliability.md), for a crash window of a few milliseconds. The
        attempt's row waits for its note, so a row never precedes the note it closes. A
        journal that cannot be written costs that insurance, not the call.
        ``TASKPLANE_INFLIGHT_JOURNAL=0`` turns it off."""
        if not self.journal:
            return
        rec = new_record(a.call, try_index=a.try_index, replica=a.replica, outcome=Outcome.ERROR, model_served=a.model,
                         started=a.started, error_type=GATEWAY_LOST, queue_ms=a.queue_ms,
                         prefill_replica=a.prefill_replica)
        note = lost.AttemptNote(record=rec, timeout_s=self.request_timeout_s,
                                price_per_hour_usd=a.replica.price_per_hour, batch_at_start=a.batch_start)
        key = rec.attempt_key
        noted = self.sink.open_attempt_soon(key, note.model_dump_json())
        noted.add_done_callback(lambda f: self._noted(key, f))
        self._notes[key] = noted

    def _noted(self, key: str, noted: asyncio.Future[None]) -> None:
        """The note is committed, or could not be: say so once per outage, not once per attempt."""
        exc = None if noted.cancelled() else noted.exception()
        if exc is not None:
            if not self._notes_failing:
                log.warning("inflight_note_failed", attempt_key=key, error=str(exc)[:200])
            self._notes_failing = True
        elif not noted.cancelled():
            self._notes_failing = False

    async def write(self, rec: AttemptRecord) -> None:
        """Every attempt row goes through here, so ``taskplane_gateway_cost_rows_total`` is the
        exact count of rows handed to the cost writer (fault tests compare it with Postgres)."""
        self.metrics.child(self.metrics.cost_rows, rec.outcome.value).inc()
        log.debug("attempt_recorded", attempt_key=rec.attempt_key, task_id=rec.task_id, outcome=rec.outcome.value,
                  replica=rec.replica, error_type=rec.error_type)
        # counted and logged first, then shielded: a client that goes away cannot drop the row
        try:
            stored = await asyncio.shield(self._after_note(rec))
        except Exception as exc:  # RowNotStored, or a bug: a row that cannot be stored must not fail the call it bills
            self.metrics.rows_lost.inc()
            self.metrics.outbox_unwritable.set(1)
            log.error("cost_row_not_stored", error=str(exc)[:300], row=rec.model_dump_json())
            return
        self.metrics.outbox_unwritable.set(1 if stored is Stored.DIRECT else 0)
        if stored is Stored.DIRECT:
            self.metrics.rows_direct.inc()

    async def _after_note(self, rec: AttemptRecord) -> Stored | None:
        """Store the row once its attempt's in-flight note (if any) is committed."""
        note = self._notes.pop(rec.attempt_key, None)
        if note is not None and not note.done():  # (usually committed long before the answer came)
            await asyncio.wait((note,))  # its failure is logged by the note itself; not cancelled with us
        return await self.sink.record_attempt(rec)

    def charge(self, rec: AttemptRecord, a: Attempt, total_ms: float, batch_end: int) -> None:
        """Price the attempt's share of the replica's batch (see ``costing``). A disaggregated
        attempt also held a share of its prefill replica until the first token (or its end)."""
        rec.gpu_seconds = costing.gpu_seconds(total_ms / 1000.0, a.batch_start, batch_end)
        rec.cost_usd = costing.cost_usd(rec.gpu_seconds, a.replica.price_per_hour)
        pre = a.prefill_lease
        if pre is not None:
            prefill_ms = min(total_ms, a.ttft_ms) if a.ttft_ms is not None else total_ms
            prefill_gpu_s = costing.gpu_seconds(prefill_ms / 1000.0, pre.batch_start, pre.release())
            rec.prefill_replica = a.prefill_replica
            rec.gpu_seconds += prefill_gpu_s
            rec.cost_usd += costing.cost_usd(prefill_gpu_s, pre.replica.price_per_hour)
        self.metrics.child(self.metrics.cost, rec.tenant).inc(rec.cost_usd)

    def success(self, a: Attempt, total_ms: float, ttft_ms: float | None, usage: Mapping[str, Any],
                batch_end: int) -> AttemptRecord:
        """The row of a served attempt, its tokens as the engine reported them."""
        call, replica = a.call, a.replica
        details = usage.get("prompt_tokens_details") or {}
        rec = new_record(call, try_index=a.try_index, replica=replica, outcome=Outcome.SUCCESS, model_served=a.model,
                         started=a.started, prompt_tokens=token_count(usage.get("prompt_tokens")) or call.prompt_tokens,
                         cached_tokens=token_count(details.get("cached_tokens")) if isinstance(details, dict) else 0,
                         completion_tokens=token_count(usage.get("completion_tokens")),
                         queue_ms=a.queue_ms, total_ms=total_ms, ttft_ms=ttft_ms)
        self.charge(rec, a, total_ms, batch_end)
        m, model = self.metrics, call.pool.model
        m.child(m.attempts, replica.name, "success").inc()
        m.child(m.requests, model, "success").inc()
        m.child(m.latency, model).observe(total_ms / 1000.0)
        if ttft_ms is not None:
            m.child(m.ttft, model).observe(ttft_ms / 1000.0)
        return rec

    def failure(self, a: Attempt, outcome: Outcome, error_type: ErrorType, total_ms: float, batch_end: int,
                ttft_ms: float | None = None) -> AttemptRecord:
        """The row of an attempt that did not serve the call: the GPU time was spent all the same."""
        rec = new_record(a.call, try_index=a.try_index, replica=a.replica, outcome=outcome, model_served=a.model,
                         started=a.started, error_type=error_type.value, queue_ms=a.queue_ms, total_ms=total_ms,
                         ttft_ms=ttft_ms)
        self.charge(rec, a, total_ms, batch_end)
        self.metrics.child(self.metrics.attempts, a.replica.name, rec.outcome.value).inc()
        return rec

    async def record_unplaced(self, call: Call, err: TaskplaneError, outcome: Outcome, try_index: int = 0) -> None:
        """A call no replica took (shed, unmeetable, none left): a row without cost."""
        rec = new_record(call, try_index=try_index, replica=None, outcome=outcome, model_served=None, started=datetime.now(UTC))
        rec.error_type = err.error_type.value
        await self.write(rec)

    async def record_cached(self, call: Call) -> None:
        """A call answered from the response cache: its whole prompt counts as cached, at no cost."""
        rec = new_record(call, try_index=0, replica=None, outcome=Outcome.CACHED, model_served=call.pool.model,
                         started=datetime.now(UTC))
        rec.cached_tokens = call.prompt_tokens
        await self.write(rec)

    def completed(self, call: Call, decision: Decision, *, ok: bool, ttft_ms: float | None, total_ms: float, cached: int,
                  completion: int = 0, batch: int | None = None) -> None:
        """Feed the attempt's outcome back to the placer (sessions, KV index, latency model)."""
        try:
            self.placer.completed(call.request, decision, ok=ok, ttft_ms=ttft_ms, total_ms=total_ms, cached_tokens=cached,
                                  completion_tokens=completion, batch_size=batch)
        except Exception as exc:  # placement feedback must never fail a call
            log.warning("placer_feedback_failed", error=str(exc))
