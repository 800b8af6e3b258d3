"""CostWriter: every attempt and task row reaches Postgres exactly once, even across outages.

Each record is first appended to the local outbox (``outbox.py``, fsynced; concurrent
appends share one fsync: ``appender.py``), then a background loop (``delivery.py``) moves
outbox rows to Postgres in batches with idempotent writes (``upserts.py``). A row leaves
the outbox only after Postgres committed it; a new writer on the same outbox replays what
is left. So nothing is lost (outbox first) and nothing is doubled (idempotent writes). If
the outbox itself cannot be written (disk full), a row goes straight to Postgres instead;
if that fails too the caller gets ``RowNotStored`` and ``refusing()`` says why for a few
seconds, so a gateway can refuse calls rather than serve them unbilled.

The writer also keeps the outbox's in-flight journal (``inflight.py``): ``open_attempt``
notes an attempt before it is sent (sharing the group commit), its row closes the note,
and ``orphaned_attempts`` hands a new process the notes a crashed one left open.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from taskplane.store import inflight
from taskplane.store.appender import OutboxAppender
from taskplane.store.backlog import Backlog
from taskplane.store.db import create_engine
from taskplane.store.delivery import DeliveryOptions, OutboxDelivery
from taskplane.store.outbox import ATTEMPT, TASK, Outbox, lock_directory, unlock
from taskplane.store.records import AttemptRecord, RowNotStored, Stored, TaskRecord
from taskplane.store.upserts import write_records

log = structlog.get_logger("taskplane.store.writer")

#: A row that cannot go to the outbox gets this long to reach Postgres directly.
DIRECT_TIMEOUT_S = 5.0
#: After a row could be stored nowhere, new calls are refused this long (then one is tried).
REFUSE_S = 5.0


def _outbox_thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskplane-outbox")


class CostWriter:
    """Durable, idempotent writer of cost rows. Use one per process (and outbox directory).

    ``record_attempt`` / ``upsert_task`` return once the record is fsynced in the outbox;
    Postgres gets it shortly after (``flush`` waits for that).
    """

    def __init__(
        self,
        database_url: str,
        outbox_dir: Path,
        *,
        batch_size: int = 500,
        min_backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        close_timeout_s: float = 5.0,
        heartbeat_s: float = 1.0,
        send_window_s: float = 0.1,
    ) -> None:
        self.database_url = database_url
        self.outbox = Outbox(Path(outbox_dir))
        self.close_timeout_s = close_timeout_s
        self._executor = _outbox_thread()  # the outbox is not thread-safe: one thread calls it
        self._backlog = Backlog()
        self._appender = OutboxAppender(self.outbox, self._io, self._backlog, heartbeat_s)
        options = DeliveryOptions(batch_size=batch_size, min_backoff_s=min_backoff_s,
                                  max_backoff_s=max_backoff_s, send_window_s=send_window_s)
        self._delivery = OutboxDelivery(database_url, self.outbox, self._io, self._backlog, options)
        self._engine: AsyncEngine | None = None
        self._sender: asyncio.Task[None] | None = None
        self._heart: asyncio.Task[None] | None = None
        self._orphans: list[inflight.Orphan] = []
        self._lock_file: IO[str] | None = None
        self._flushing = 0  # flush() calls waiting
        self._outbox_error: str | None = None  # the outbox's last write failure, until it takes a row again
        self._direct_rows = 0  # rows written straight to Postgres
        self._unstorable: str | None = None
        self._unstorable_at: float | None = None

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Open the outbox, count what an earlier run left, and start delivering."""
        if self._sender is not None:
            return
        backlog = self._backlog
        self._lock_file = lock_directory(self.outbox.path.parent)
        await self._io(self.outbox.open)
        self._orphans = await self._io(self.outbox.take_orphans)  # before this process notes or beats
        backlog.pending = await self._io(self.outbox.count)
        self._delivery.dead = await self._io(self.outbox.dead_count)
        self._engine = create_engine(self.database_url)
        backlog.closed = False
        backlog.stop.clear()
        backlog.urgent.clear()  # set by an earlier close()
        self._sender = asyncio.create_task(self._delivery.run(self._engine), name="taskplane-cost-writer")
        self._heart = asyncio.create_task(self._appender.heartbeat(), name="taskplane-outbox-heartbeat")
        if backlog.pending:
            log.info("outbox replay", pending=backlog.pending, outbox=str(self.outbox.path))
        if self._orphans:
            log.warning("attempts left in flight by a process that died", orphans=len(self._orphans),
                        outbox=str(self.outbox.path))

    async def close(self) -> None:
        """Deliver what can be delivered within ``close_timeout_s``, then stop. The rest stays
        in the outbox for the next start."""
        if self._sender is None:
            return
        await self.flush(self.close_timeout_s)
        backlog = self._backlog
        backlog.closed = True
        backlog.stop.set()
        backlog.urgent.set()
        backlog.wake.set()
        await self._appender.drained()
        self._sender.cancel()
        if self._heart is not None:
            self._heart.cancel()
        await asyncio.gather(self._sender, *([self._heart] if self._heart else []), return_exceptions=True)
        self._sender = None
        self._heart = None
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None
        await self._io(self.outbox.close)
        self._executor.shutdown(wait=True)
        self._executor = _outbox_thread()
        unlock(self._lock_file)
        self._lock_file = None
        if backlog.pending:
            log.warning("cost rows left in the outbox", pending=backlog.pending, outbox=str(self.outbox.path))

    async def __aenter__(self) -> CostWriter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- the public writes ------------------------------------------------------------

    async def record_attempt(self, rec: AttemptRecord) -> Stored:
        """Record one LLM call attempt (idempotent on ``rec.attempt_key``); where it went.
        Raises ``RowNotStored`` when neither the outbox nor Postgres could take it."""
        try:
            return await self._store(ATTEMPT, rec.attempt_key, rec)
        finally:
            self._appender.open_keys.discard(rec.attempt_key)

    async def open_attempt(self, attempt_key: str, note: str) -> None:
        """Note an attempt as in flight (fsynced on return); its ``record_attempt`` closes the
        note. Call just before the request goes to the replica."""
        await asyncio.shield(self.open_attempt_soon(attempt_key, note))

    def open_attempt_soon(self, attempt_key: str, note: str) -> asyncio.Future[None]:
        """``open_attempt`` without waiting: the note joins the next group commit, and the
        future is done once it is fsynced (no task per note: this runs for every attempt)."""
        return self._appender.note_open(attempt_key, note)

    def orphaned_attempts(self) -> list[inflight.Orphan]:
        """Attempts the previous process on this outbox left open (it died mid-attempt).
        Each stays noted until a row with its key is recorded through this writer."""
        return list(self._orphans)

    async def upsert_task(self, rec: TaskRecord) -> Stored:
        """Create or update a task row; a terminal status is never overwritten by ``running``."""
        return await self._store(TASK, rec.task_id, rec)

    def refusing(self) -> str | None:
        """Why new rows could not be stored right now (the outbox and then Postgres failed
        within ``REFUSE_S``), else None. After ``REFUSE_S`` one more row is tried."""
        if self._unstorable_at is not None and time.monotonic() - self._unstorable_at < REFUSE_S:
            return self._unstorable
        return None

    async def _store(self, kind: str, key: str, rec: AttemptRecord | TaskRecord) -> Stored:
        """The outbox first; if it cannot be written (disk full, I/O error), Postgres directly."""
        try:
            await asyncio.shield(self._appender.enqueue(kind, key, rec.model_dump_json()))
        except (OSError, sqlite3.Error) as exc:
            return await self._direct(rec, exc)
        if self._outbox_error is not None:
            log.info("the outbox takes rows again", direct_rows=self._direct_rows)
            self._outbox_error = None
        return Stored.OUTBOX

    async def _direct(self, rec: AttemptRecord | TaskRecord, outbox_exc: BaseException) -> Stored:
        if self._outbox_error is None:
            log.error("the outbox cannot be written: rows go straight to Postgres", outbox=str(self.outbox.path),
                      error=str(outbox_exc)[:200])
        self._outbox_error = str(outbox_exc)[:200] or type(outbox_exc).__name__
        try:
            assert self._engine is not None
            attempts = [rec] if isinstance(rec, AttemptRecord) else []
            tasks = [rec] if isinstance(rec, TaskRecord) else []
            await asyncio.wait_for(write_records(self._engine, attempts, tasks), timeout=DIRECT_TIMEOUT_S)
        except Exception as exc:
            self._unstorable = f"outbox unwritable ({self._outbox_error}) and Postgres failed ({str(exc)[:120] or type(exc).__name__})"
            self._unstorable_at = time.monotonic()
            raise RowNotStored(self._unstorable) from exc
        self._direct_rows += 1
        self._unstorable_at = None
        return Stored.DIRECT

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every record appended so far is in Postgres; False if ``timeout`` ran out."""
        backlog = self._backlog
        deadline = None if timeout is None else time.monotonic() + timeout
        self._flushing += 1
        backlog.urgent.set()
        try:
            while backlog.pending > 0:
                if self._sender is None or self._sender.done():
                    return False
                backlog.progress.clear()
                backlog.wake.set()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(backlog.progress.wait(), timeout=remaining)
                except TimeoutError:
                    return backlog.pending == 0
            return True
        finally:
            self._flushing -= 1
            if not self._flushing and not backlog.closed:
                backlog.urgent.clear()

    def pending(self) -> int:
        """Records accepted but not yet committed to Postgres (safe to call from any thread)."""
        return self._backlog.pending

    def stats(self) -> dict[str, Any]:
        """Counters for health pages and metrics."""
        return {
            "pending": self._backlog.pending,
            **self._delivery.stats(),
            "outbox": str(self.outbox.path),
            "open_attempts": len(self._appender.open_keys),
            "outbox_ok": self._outbox_error is None,
            "outbox_error": self._outbox_error,
            "direct": self._direct_rows,
        }

    async def _io(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
