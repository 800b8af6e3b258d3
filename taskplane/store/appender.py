"""Group commit into the cost outbox, and the heartbeat of attempts in flight.

Rows and in-flight notes that arrive while one fsync runs share the next one, so
concurrent appends pay one fsync together. While attempts are noted open and nothing else
committed lately, a heartbeat stamps the outbox as alive: a crash then leaves their
estimated end at most ``heartbeat_s`` early.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from taskplane.store.backlog import Backlog, OutboxCall
from taskplane.store.outbox import Outbox

log = structlog.get_logger("taskplane.store.writer")

#: an in-flight note, not a row: it goes to the journal, never to Postgres
OPEN = "open"


class OutboxAppender:
    """Appends entries to the outbox in group commits; keeps the keys of attempts noted open."""

    def __init__(self, outbox: Outbox, io: OutboxCall, backlog: Backlog, heartbeat_s: float) -> None:
        self.outbox = outbox
        self.heartbeat_s = heartbeat_s
        self.open_keys: set[str] = set()  # attempt keys noted open by this process
        self._io = io
        self._backlog = backlog
        self._waiting: list[tuple[str, str, str, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._last_commit = 0.0

    def enqueue(self, kind: str, key: str, payload: str) -> asyncio.Future[None]:
        """Queue one entry for the next group commit; the future is done once it is fsynced."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._backlog.closed:
            fut.set_exception(RuntimeError("CostWriter is not started (call `await writer.start()` first)"))
            return fut
        self._waiting.append((kind, key, payload, fut))
        if kind != OPEN:
            self._backlog.pending += 1
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())
        return fut

    def note_open(self, attempt_key: str, note: str) -> asyncio.Future[None]:
        """Note an attempt as in flight; the future is done once the note is fsynced."""
        self.open_keys.add(attempt_key)
        committed = self.enqueue(OPEN, attempt_key, note)
        committed.add_done_callback(lambda f: self._unless_noted(attempt_key, f))
        return committed

    def _unless_noted(self, attempt_key: str, committed: asyncio.Future[None]) -> None:
        """A note that could not be written (disk full?) leaves nothing to keep alive for."""
        if not committed.cancelled() and committed.exception() is not None:
            self.open_keys.discard(attempt_key)

    async def drained(self) -> None:
        """Wait for the group commit under way (its failures went to the callers)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _drain(self) -> None:
        """Group commit: everything that arrived while the last fsync ran goes in the next one."""
        while self._waiting:
            batch, self._waiting = self._waiting, []
            rows = [(k, key, p) for k, key, p, _ in batch if k != OPEN]
            opens = [(key, p) for k, key, p, _ in batch if k == OPEN]
            try:
                await self._io(self.outbox.append_many, rows, opens)
            except Exception as exc:  # disk full, permissions: the caller must know
                self._backlog.pending -= len(rows)
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            self._last_commit = time.monotonic()
            for *_, fut in batch:
                if not fut.done():
                    fut.set_result(None)
            if rows:
                self._backlog.wake.set()

    async def heartbeat(self) -> None:
        """While attempts are in flight and nothing else committed lately, stamp the outbox alive."""
        beat_failing = False
        while True:
            due = self._last_commit + self.heartbeat_s - time.monotonic()
            if not self.open_keys or due > 0:
                await asyncio.sleep(due if self.open_keys else self.heartbeat_s / 4)
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
