"""The durable local outbox: cost rows wait here until Postgres has them.

A SQLite file (WAL journal, ``synchronous=FULL``: every commit is fsynced) rather than
hand-rolled append-only files, because it gives atomic appends, crash-safe deletion of
what was delivered, and a single file to inspect (``sqlite3 outbox.sqlite3``) for free.
Rows are deleted only after Postgres committed them; a crash in between replays them,
which the idempotent writes in Postgres absorb. Rows Postgres rejects as bad data go to
a ``dead`` table instead of blocking the queue.

The same file holds the in-flight journal (``inflight.py``): attempts sent to a replica
whose row is not written yet. Appending an attempt's row closes its note in the same
transaction.

Not thread-safe by itself: the writer calls it from one dedicated thread.
"""

from __future__ import annotations

import fcntl
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from taskplane.errors import UserError
from taskplane.store import inflight

FILE_NAME = "outbox.sqlite3"
#: the kinds of outbox rows
ATTEMPT = "attempt"
TASK = "task"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS dead (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    created REAL NOT NULL,
    error TEXT NOT NULL,
    died REAL NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    seq: int
    kind: str  # ATTEMPT or TASK
    key: str  # attempt_key or task_id
    payload: str  # the record as JSON


class Outbox:
    """An append-only queue of JSON records in one SQLite file under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / FILE_NAME
        self._conn: sqlite3.Connection | None = None

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript(_SCHEMA)
        conn.executescript(inflight.SCHEMA)
        self._conn = conn

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("outbox is not open")
        return self._conn

    def append_many(self, items: list[tuple[str, str, str]], opens: list[tuple[str, str]] | None = None) -> None:
        """Append ``(kind, key, payload)`` items and open ``(attempt_key, note)`` in-flight
        notes in one fsynced transaction (a group commit). An appended attempt row closes
        its own note: the row and the note's removal commit together."""
        now = time.time()
        with _transaction(self.conn):
            self.conn.executemany(
                "INSERT INTO outbox (kind, key, payload, created) VALUES (?, ?, ?, ?)",
                [(kind, key, payload, now) for kind, key, payload in items],
            )
            if opens:
                inflight.open_notes(self.conn, opens, now)
            inflight.close_notes(self.conn, [key for kind, key, _ in items if kind == ATTEMPT])
            inflight.touch(self.conn, now)

    def beat(self) -> None:
        """Record that this process is alive (the end of an orphaned attempt's estimate)."""
        with _transaction(self.conn):
            inflight.touch(self.conn, time.time())

    def take_orphans(self) -> list[inflight.Orphan]:
        """Attempts an earlier process left open (see ``inflight.take_orphans``)."""
        return inflight.take_orphans(self.conn)

    def peek(self, limit: int) -> list[OutboxRow]:
        """The oldest ``limit`` rows, in append order."""
        cur = self.conn.execute("SELECT seq, kind, key, payload FROM outbox ORDER BY seq LIMIT ?", (limit,))
        return [OutboxRow(*row) for row in cur.fetchall()]

    def delete(self, seqs: list[int]) -> None:
        """Forget rows Postgres has committed."""
        if not seqs:
            return
        with _transaction(self.conn):
            self.conn.executemany("DELETE FROM outbox WHERE seq = ?", [(s,) for s in seqs])
            inflight.touch(self.conn, time.time())

    def bury(self, row: OutboxRow, error: str) -> None:
        """Move a row Postgres rejects as bad data to ``dead`` so the rest can flow."""
        with _transaction(self.conn):
            self.conn.execute(
                "INSERT OR REPLACE INTO dead (seq, kind, key, payload, created, error, died) "
                "SELECT seq, kind, key, payload, created, ?, ? FROM outbox WHERE seq = ?",
                (error[:2000], time.time(), row.seq),
            )
            self.conn.execute("DELETE FROM outbox WHERE seq = ?", (row.seq,))

    def count(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM outbox").fetchone()[0])

    def dead_count(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM dead").fetchone()[0])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def lock_directory(directory: Path) -> IO[str]:
    """One writer per outbox directory: a second one would deliver rows the first counts.
    The lock is held until ``unlock``."""
    directory.mkdir(parents=True, exist_ok=True)
    handle = open(directory / "writer.lock", "a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise UserError(
            f"the cost outbox {directory} is in use by another writer; give each process its own outbox directory"
        ) from None
    return handle


def unlock(handle: IO[str] | None) -> None:
    if handle is not None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        handle.close()


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT (autocommit connection), ROLLBACK on error."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
