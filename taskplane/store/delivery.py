"""The cost writer's send loop: outbox rows to Postgres in batches, retried until they land.

Once woken it gathers rows for ``send_window_s`` before it sends (``flush`` and ``close``
skip the wait): a Postgres transaction per handful of rows cost a streamed call ~1 ms of
the gateway's CPU at 200 concurrent streams; one per tick costs a few hundredths of that.
A row leaves the outbox only after Postgres committed it. While Postgres is down the loop
retries with capped exponential backoff. A batch Postgres rejects as bad data is retried
row by row and the rows it rejects are buried in the outbox's dead table.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from taskplane.store.backlog import Backlog, OutboxCall
from taskplane.store.db import describe_url, is_unreachable
from taskplane.store.outbox import ATTEMPT, Outbox, OutboxRow
from taskplane.store.records import AttemptRecord, TaskRecord
from taskplane.store.upserts import is_bad_data, write_records

log = structlog.get_logger("taskplane.store.writer")


@dataclass(frozen=True, kw_only=True)
class DeliveryOptions:
    batch_size: int = 500
    min_backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    send_window_s: float = 0.1


def _decode(row: OutboxRow) -> AttemptRecord | TaskRecord:
    if row.kind == ATTEMPT:
        return AttemptRecord.model_validate_json(row.payload)
    return TaskRecord.model_validate_json(row.payload)


class OutboxDelivery:
    """Moves outbox rows to Postgres; counts what it delivered, buried and why it last failed."""

    def __init__(
        self, database_url: str, outbox: Outbox, io: OutboxCall, backlog: Backlog, options: DeliveryOptions
    ) -> None:
        self.database_url = database_url
        self.outbox = outbox
        self.options = options
        self.written = 0
        self.batches = 0  # Postgres transactions that delivered rows
        self.dead = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.postgres_ok: bool | None = None
        self._io = io
        self._backlog = backlog
        self._engine: AsyncEngine | None = None

    async def run(self, engine: AsyncEngine) -> None:
        """Deliver until ``close()``: forever, or until the outbox is empty once closed."""
        self._engine = engine
        backlog, opts = self._backlog, self.options
        backoff = opts.min_backoff_s
        while True:
            rows: list[OutboxRow] = await self._io(self.outbox.peek, opts.batch_size)
            if not rows:
                if backlog.closed:
                    return
                backlog.wake.clear()
                if backlog.pending == 0:  # else appends are in flight: the next peek queues behind them
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(backlog.wake.wait(), timeout=5.0)
                await self._gather()
                continue
            try:
                await self._deliver(rows)
            except Exception as exc:
                self._note_error(exc)
                delay = backoff * random.uniform(0.8, 1.2)
                backoff = min(backoff * 2, opts.max_backoff_s)
                backlog.progress.set()  # let flush() re-check its deadline
                if backlog.closed:
                    return
                try:
                    await asyncio.wait_for(backlog.stop.wait(), timeout=delay)
                except TimeoutError:
                    pass
                continue
            backoff = opts.min_backoff_s
            if len(rows) < opts.batch_size:
                await self._gather()

    async def _gather(self) -> None:
        """Let rows gather for one send window (one transaction for all of them), unless
        someone waits for them or a batch is full already."""
        backlog, opts = self._backlog, self.options
        if opts.send_window_s <= 0 or backlog.urgent.is_set() or backlog.pending >= opts.batch_size:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(backlog.urgent.wait(), timeout=opts.send_window_s)

    async def _deliver(self, rows: list[OutboxRow]) -> None:
        """Write one batch; on bad data, fall back to row by row and bury what Postgres rejects."""
        try:
            await self._write(rows)
        except DBAPIError as exc:
            if not is_bad_data(exc):
                raise
            for row in rows:
                try:
                    await self._write([row])
                except DBAPIError as row_exc:
                    if not is_bad_data(row_exc):
                        raise
                    await self._bury(row, row_exc)
                    continue
                await self._done([row])
            return
        await self._done(rows)

    async def _write(self, rows: list[OutboxRow]) -> None:
        assert self._engine is not None
        records = [_decode(r) for r in rows]
        await write_records(
            self._engine,
            [r for r in records if isinstance(r, AttemptRecord)],
            [r for r in records if isinstance(r, TaskRecord)],
        )

    async def _bury(self, row: OutboxRow, exc: DBAPIError) -> None:
        await self._io(self.outbox.bury, row, str(exc.orig or exc))
        self._backlog.pending -= 1
        self.dead += 1
        log.error("cost row rejected by Postgres; kept in the outbox's dead table",
                  kind=row.kind, key=row.key, error=str(exc.orig or exc)[:300])

    async def _done(self, rows: list[OutboxRow]) -> None:
        await self._io(self.outbox.delete, [r.seq for r in rows])
        self._backlog.pending -= len(rows)
        self.written += len(rows)
        self.batches += 1
        if self.postgres_ok is not True:
            if self.postgres_ok is False:
                log.info("Postgres is back; outbox draining", pending=self._backlog.pending)
            self.postgres_ok = True
        self._backlog.progress.set()

    def _note_error(self, exc: BaseException) -> None:
        message = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        self.last_error = (message[0] if message else type(exc).__name__)[:300]
        self.last_error_at = time.time()
        if self.postgres_ok is not False:
            log.warning(
                "cost rows wait in the outbox: Postgres write failed",
                database=describe_url(self.database_url),
                unreachable=is_unreachable(exc),
                error=self.last_error,
                pending=self._backlog.pending,
            )
        self.postgres_ok = False

    def stats(self) -> dict[str, Any]:
        return {
            "written": self.written,
            "batches": self.batches,
            "dead": self.dead,
            "postgres_ok": self.postgres_ok,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
        }
