"""CostWriter: every attempt and task row reaches Postgres exactly once, even across outages.

Each record is first appended to the local outbox (``outbox.py``, fsynced; concurrent
appends share one fsync), then a background loop moves outbox rows to Postgres in
batches: attempts with ``INSERT ... ON CONFLICT (attempt_key) DO NOTHING``, tasks with
an upsert that never turns a terminal status back into ``running``. Once woken it gathers
rows for ``send_window_s`` before it sends (``flush`` and ``close`` skip the wait): a
Postgres transaction per handful of rows cost a streamed call ~1 ms of the gateway's CPU
at 200 concurrent streams; one per tick costs a few hundredths of that. A row leaves the
outbox only after Postgres committed it. While Postgres is down the loop retries with
capped exponential backoff; a new writer on the same outbox replays what is left.
So nothing is lost (outbox first) and nothing is doubled (idempotent writes). If the
outbox itself cannot be written (disk full), a row goes straight to Postgres instead; if
that fails too the caller gets ``RowNotStored`` and ``refusing()`` says why for a few
seconds, so a gateway can refuse calls rather than serve them unbilled.

The writer also keeps the outbox's in-flight journal (``inflight.py``): ``open_attempt``
notes an attempt before it is sent (sharing the group commit), its row closes the note,
and ``orphaned_attempts`` hands a new process the notes a crashed one left open.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import random
import sqlite3
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import func, or_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from taskplane.errors import UserError
from taskplane.store import inflight
from taskplane.store.db import create_engine, describe_url, is_unreachable, sqlstate
from taskplane.store.models import LlmCall, Task
from taskplane.store.outbox import Outbox, OutboxRow
from taskplane.store.records import AttemptRecord, RowNotStored, Stored, TaskRecord, TaskStatus

log = structlog.get_logger("taskplane.store.writer")

ATTEMPT = "attempt"
TASK = "task"
OPEN = "open"  # an in-flight note, not a row: it goes to the journal, never to Postgres
#: A row that cannot go to the outbox gets this long to reach Postgres directly.
DIRECT_TIMEOUT_S = 5.0
#: After a row could be stored nowhere, new calls are refused this long (then one is tried).
REFUSE_S = 5.0


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _clean(value: Any) -> Any:
    """Postgres text cannot hold NUL; strip it rather than reject the row."""
    return value.replace("\x00", "") if isinstance(value, str) else value


def attempt_row(rec: AttemptRecord) -> dict[str, Any]:
    """The ``llm_calls`` row of an attempt record."""
    row = {k: _clean(v) for k, v in rec.model_dump().items()}
    row["outcome"] = str(rec.outcome.value)
    row["started_at"] = _utc(rec.started_at)
    return row


def task_row(rec: TaskRecord) -> dict[str, Any]:
    """The ``tasks`` row of a task record."""
    row = {k: _clean(v) for k, v in rec.model_dump().items()}
    row["status"] = str(rec.status.value)
    for key in ("deadline", "started_at", "finished_at"):
        row[key] = _utc(row[key])
    return row


def merge_task(old: TaskRecord, new: TaskRecord) -> TaskRecord:
    """The task record after ``new`` is written over ``old`` (same rule as the SQL upsert).

    Last writer wins, except that a terminal status is never replaced by ``running``;
    the earliest start is kept and a missing deadline / finish time does not erase one.
    """
    if old.status is not TaskStatus.RUNNING and new.status is TaskStatus.RUNNING:
        return old
    started = min(_utc(old.started_at), _utc(new.started_at))  # type: ignore[type-var]
    return new.model_copy(
        update={
            "started_at": started,
            "deadline": new.deadline if new.deadline is not None else old.deadline,
            "deadline_met": new.deadline_met if new.deadline_met is not None else old.deadline_met,
            "finished_at": new.finished_at if new.finished_at is not None else old.finished_at,
            "parent_task_id": new.parent_task_id or old.parent_task_id,
            "root_task_id": new.root_task_id or old.root_task_id,
        }
    )


def _task_upsert() -> Any:
    stmt = pg_insert(Task)
    ex = stmt.excluded
    tasks = Task.__table__.c
    return stmt.on_conflict_do_update(
        index_elements=[tasks.task_id],
        set_={
            "agent": ex.agent,
            "tenant": ex.tenant,
            "priority": ex.priority,
            "status": ex.status,
            "deadline": func.coalesce(ex.deadline, tasks.deadline),
            "deadline_met": func.coalesce(ex.deadline_met, tasks.deadline_met),
            "started_at": func.least(tasks.started_at, ex.started_at),
            "finished_at": func.coalesce(ex.finished_at, tasks.finished_at),
            "cost_usd": ex.cost_usd,
            "attempts": ex.attempts,
            "retries": ex.retries,
            "error": ex.error,
            "parent_task_id": func.coalesce(ex.parent_task_id, tasks.parent_task_id),
            "root_task_id": func.coalesce(ex.root_task_id, tasks.root_task_id),
            "updated_at": func.now(),
        },
        where=or_(tasks.status == TaskStatus.RUNNING.value, ex.status != TaskStatus.RUNNING.value),
    )


async def write_records(
    engine: AsyncEngine, attempts: Iterable[AttemptRecord], tasks: Iterable[TaskRecord]
) -> None:
    """Write records straight to Postgres in one transaction, idempotently (no outbox)."""
    merged: dict[str, TaskRecord] = {}
    for t in tasks:
        merged[t.task_id] = merge_task(merged[t.task_id], t) if t.task_id in merged else t
    attempt_rows: dict[str, dict[str, Any]] = {}
    for a in attempts:  # the first row of a key wins, as ON CONFLICT DO NOTHING does across batches
        attempt_rows.setdefault(a.attempt_key, attempt_row(a))
    async with engine.begin() as conn:
        if attempt_rows:
            stmt = pg_insert(LlmCall).on_conflict_do_nothing(index_elements=["attempt_key"])
            await conn.execute(stmt, list(attempt_rows.values()))
        if merged:
            await conn.execute(_task_upsert(), [task_row(t) for t in merged.values()])


def _decode(row: OutboxRow) -> AttemptRecord | TaskRecord:
    if row.kind == ATTEMPT:
        return AttemptRecord.model_validate_json(row.payload)
    return TaskRecord.model_validate_json(row.payload)


def _lock_directory(directory: Path) -> Any:
    """One writer per outbox directory: a second one would deliver rows the first counts."""
    directory.mkdir(parents=True, exist_ok=True)
    handle = open(directory / "writer.lock", "a+")  # held until close()
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise UserError(
            f"the cost outbox {directory} is in use by another writer; give each process its own outbox directory"
        ) from None
    return handle


def _unlock(handle: Any) -> None:
    if handle is not None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        handle.close()


def _is_bad_data(exc: BaseException) -> bool:
    """Postgres rejected the values themselves (SQLSTATE class 22 data, 23 constraint)."""
    state = sqlstate(exc)
    return state is not None and state[:2] in {"22", "23"}


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
        self.batch_size = batch_size
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.close_timeout_s = close_timeout_s
        self.heartbeat_s = heartbeat_s
        self.send_window_s = send_window_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskplane-outbox")
        self._engine: AsyncEngine | None = None
        self._waiting: list[tuple[str, str, str, asyncio.Future[None]]] = []
        self._appender: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._heart: asyncio.Task[None] | None = None
        self._open: set[str] = set()  # attempt keys noted open by this process
        self._orphans: list[inflight.Orphan] = []
        self._last_commit = 0.0
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._urgent = asyncio.Event()  # flush() or close() waits: send without gathering
        self._stop = asyncio.Event()
        self._lock_file: Any = None
        self._closing = False
        self._flushing = 0  # flush() calls waiting
        self._pending = 0
        self._written = 0
        self._batches = 0  # Postgres transactions that delivered rows
        self._dead = 0
        self._last_error: str | None = None
        self._last_error_at: float | None = None
        self._postgres_ok: bool | None = None
        self._outbox_error: str | None = None  # the outbox's last write failure, until it takes a row again
        self._direct_rows = 0  # rows written straight to Postgres
        self._unstorable: str | None = None
        self._unstorable_at: float | None = None

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Open the outbox, count what an earlier run left, and start delivering."""
        if self._sender is not None:
            return
        self._lock_file = _lock_directory(self.outbox.path.parent)
        await self._io(self.outbox.open)
        self._orphans = await self._io(self.outbox.take_orphans)  # before this process notes or beats
        self._pending = await self._io(self.outbox.count)
        self._dead = await self._io(self.outbox.dead_count)
        self._engine = create_engine(self.database_url)
        self._closing = False
        self._stop.clear()
        self._urgent.clear()  # set by an earlier close()
        self._sender = asyncio.create_task(self._send_loop(), name="taskplane-cost-writer")
        self._heart = asyncio.create_task(self._heartbeat(), name="taskplane-outbox-heartbeat")
        if self._pending:
            log.info("outbox replay", pending=self._pending, outbox=str(self.outbox.path))
        if self._orphans:
            log.warning("attempts left in flight by a process that died", orphans=len(self._orphans),
                        outbox=str(self.outbox.path))

    async def close(self) -> None:
        """Deliver what can be delivered within ``close_timeout_s``, then stop. The rest stays
        in the outbox for the next start."""
        if self._sender is None:
            return
        await self.flush(self.close_timeout_s)
        self._closing = True
        self._stop.set()
        self._urgent.set()
        self._wake.set()
        if self._appender is not None:
            await asyncio.gather(self._appender, return_exceptions=True)
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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskplane-outbox")
        _unlock(self._lock_file)
        self._lock_file = None
        if self._pending:
            log.warning("cost rows left in the outbox", pending=self._pending, outbox=str(self.outbox.path))

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
            self._open.discard(rec.attempt_key)

    async def open_attempt(self, attempt_key: str, note: str) -> None:
        """Note an attempt as in flight (fsynced on return); its ``record_attempt`` closes the
        note. Call just before the request goes to the replica."""
        await asyncio.shield(self.open_attempt_soon(attempt_key, note))

    def open_attempt_soon(self, attempt_key: str, note: str) -> asyncio.Future[None]:
        """``open_attempt`` without waiting: the note joins the next group commit, and the
        future is done once it is fsynced (no task per note: this runs for every attempt)."""
        self._open.add(attempt_key)
        committed = self._enqueue(OPEN, attempt_key, note)
        committed.add_done_callback(lambda f: self._unless_noted(attempt_key, f))
        return committed

    def _unless_noted(self, attempt_key: str, committed: asyncio.Future[None]) -> None:
        """A note that could not be written (disk full?) leaves nothing to keep alive for."""
        if not committed.cancelled() and committed.exception() is not None:
            self._open.discard(attempt_key)

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
            await self._append(kind, key, rec.model_dump_json())
        except (OSError, sqlite3.Error) as exc:
            return await self._direct(kind, rec, exc)
        if self._outbox_error is not None:
            log.info("the outbox takes rows again", direct_rows=self._direct_rows)
            self._outbox_error = None
        return Stored.OUTBOX

    async def _direct(self, kind: str, rec: AttemptRecord | TaskRecord, outbox_exc: BaseException) -> Stored:
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
        deadline = None if timeout is None else time.monotonic() + timeout
        self._flushing += 1
        self._urgent.set()
        try:
            while self._pending > 0:
                if self._sender is None or self._sender.done():
                    return False
                self._progress.clear()
                self._wake.set()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(self._progress.wait(), timeout=remaining)
                except TimeoutError:
                    return self._pending == 0
            return True
        finally:
            self._flushing -= 1
            if not self._flushing and not self._closing:
                self._urgent.clear()

    def pending(self) -> int:
        """Records accepted but not yet committed to Postgres (safe to call from any thread)."""
        return self._pending

    def stats(self) -> dict[str, Any]:
        """Counters for health pages and metrics."""
        return {
            "pending": self._pending,
            "written": self._written,
            "batches": self._batches,
            "dead": self._dead,
            "postgres_ok": self._postgres_ok,
            "last_error": self._last_error,
            "last_error_at": self._last_error_at,
            "outbox": str(self.outbox.path),
            "open_attempts": len(self._open),
            "outbox_ok": self._outbox_error is None,
            "outbox_error": self._outbox_error,
            "direct": self._direct_rows,
        }

    # ---- internals ---------------------------------------------------------------------

    async def _io(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _append(self, kind: str, key: str, payload: str) -> None:
        await asyncio.shield(self._enqueue(kind, key, payload))

    def _enqueue(self, kind: str, key: str, payload: str) -> asyncio.Future[None]:
        """Queue one entry for the next group commit; the future is done once it is fsynced."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._sender is None or self._closing:
            fut.set_exception(RuntimeError("CostWriter is not started (call `await writer.start()` first)"))
            return fut
        self._waiting.append((kind, key, payload, fut))
        if kind != OPEN:
            self._pending += 1
        if self._appender is None or self._appender.done():
            self._appender = asyncio.create_task(self._drain_appends())
        return fut

    async def _drain_appends(self) -> None:
        """Group commit: everything that arrived while the last fsync ran goes in the next one."""
        while self._waiting:
            batch, self._waiting = self._waiting, []
            rows = [(k, key, p) for k, key, p, _ in batch if k != OPEN]
            opens = [(key, p) for k, key, p, _ in batch if k == OPEN]
            try:
                await self._io(self.outbox.append_many, rows, opens)
            except Exception as exc:  # disk full, permissions: the caller must know
                self._pending -= len(rows)
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            self._last_commit = time.monotonic()
            for *_, fut in batch:
                if not fut.done():
                    fut.set_result(None)
            if rows:
                self._wake.set()

    async def _heartbeat(self) -> None:
        """While attempts are in flight and nothing else committed lately, stamp the outbox
        as alive: a crash then leaves their estimated end at most ``heartbeat_s`` early."""
        beat_failing = False
        while True:
            due = self._last_commit + self.heartbeat_s - time.monotonic()
            if not self._open or due > 0:
                await asyncio.sleep(due if self._open else self.heartbeat_s / 4)
                continue
            try:
                await self._io(self.outbox.beat)
            except Exception as exc:  # a failed beat only shortens a crash estimate
                if not beat_failing:  # once per outage, not once a second
                    log.warning("outbox heartbeat failed", error=str(exc)[:200])
                beat_failing = True
            else:
                beat_failing = False
            self._last_commit = time.monotonic()

    async def _send_loop(self) -> None:
        backoff = self.min_backoff_s
        while True:
            rows: list[OutboxRow] = await self._io(self.outbox.peek, self.batch_size)
            if not rows:
                if self._closing:
                    return
                self._wake.clear()
                if self._pending == 0:  # else appends are in flight: the next peek queues behind them
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout=5.0)
                await self._gather()
                continue
            try:
                await self._deliver(rows)
            except Exception as exc:
                self._note_error(exc)
                delay = backoff * random.uniform(0.8, 1.2)
                backoff = min(backoff * 2, self.max_backoff_s)
                self._progress.set()  # let flush() re-check its deadline
                if self._closing:
                    return
                try:
                    await asyncio.wait_for(self._stop.wait(), timeout=delay)
                except TimeoutError:
                    pass
                continue
            backoff = self.min_backoff_s
            if len(rows) < self.batch_size:
                await self._gather()

    async def _gather(self) -> None:
        """Let rows gather for one send window (one transaction for all of them), unless
        someone waits for them or a batch is full already."""
        if self.send_window_s <= 0 or self._urgent.is_set() or self._pending >= self.batch_size:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._urgent.wait(), timeout=self.send_window_s)

    async def _deliver(self, rows: list[OutboxRow]) -> None:
        """Write one batch; on bad data, fall back to row by row and bury what Postgres rejects."""
        assert self._engine is not None
        try:
            await self._write(rows)
        except DBAPIError as exc:
            if not _is_bad_data(exc):
                raise
            for row in rows:
                try:
                    await self._write([row])
                except DBAPIError as row_exc:
                    if not _is_bad_data(row_exc):
                        raise
                    await self._io(self.outbox.bury, row, str(row_exc.orig or row_exc))
                    self._pending -= 1
                    self._dead += 1
                    log.error("cost row rejected by Postgres; kept in the outbox's dead table",
                              kind=row.kind, key=row.key, error=str(row_exc.orig or row_exc)[:300])
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

    async def _done(self, rows: list[OutboxRow]) -> None:
        await self._io(self.outbox.delete, [r.seq for r in rows])
        self._pending -= len(rows)
        self._written += len(rows)
        self._batches += 1
        if self._postgres_ok is not True:
            if self._postgres_ok is False:
                log.info("Postgres is back; outbox draining", pending=self._pending)
            self._postgres_ok = True
        self._progress.set()

    def _note_error(self, exc: BaseException) -> None:
        message = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        self._last_error = (message[0] if message else type(exc).__name__)[:300]
        self._last_error_at = time.time()
        if self._postgres_ok is not False:
            log.warning(
                "cost rows wait in the outbox: Postgres write failed",
                database=describe_url(self.database_url),
                unreachable=is_unreachable(exc),
                error=self._last_error,
                pending=self._pending,
            )
        self._postgres_ok = False
