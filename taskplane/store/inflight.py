"""The in-flight journal: attempts dispatched to a replica whose row is not written yet.

A gateway killed with SIGKILL while a replica works on a call dies before it can write
that attempt's cost row, yet the replica spent GPU time on it. So before an attempt is
sent, the gateway notes it as *open* here; the attempt's row closes the note in the same
fsynced SQLite transaction that appends the row to the outbox (``Outbox.append_many``).
A note still open when the next writer starts on the directory was left by a process
that died mid-attempt: an *orphan*, which the gateway turns into an estimated row.

The notes live in two small tables of the outbox file itself, so opening a note shares
the outbox's group commit (one fsync for everything that arrived meanwhile), and a row
and its note's removal are one atomic commit. ``alive`` holds the time of the writer's
last commit (every transaction touches it, and a heartbeat does while notes are open):
the last moment the process is known to have been alive, the end of an orphan's
estimated GPU time. Payloads are opaque JSON here: the gateway decides what a note says.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

SCHEMA = """
CREATE TABLE IF NOT EXISTS open_attempts (
    key TEXT PRIMARY KEY,
    payload TEXT NOT NULL,
    opened REAL NOT NULL,
    orphaned_at REAL
);
CREATE TABLE IF NOT EXISTS alive (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    at REAL NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Orphan:
    """An attempt left open by a process that died: its note and when that process was last alive."""

    key: str  # the attempt_key the attempt's own row would have had
    payload: str  # the note, as the gateway wrote it
    opened: float  # unix time the note was written (just before the request was sent)
    last_alive: float  # unix time of the dead process's last outbox commit or heartbeat


def touch(conn: sqlite3.Connection, now: float) -> None:
    """Mark the writer alive at ``now`` (inside the caller's transaction)."""
    conn.execute("INSERT INTO alive (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at", (now,))


def open_notes(conn: sqlite3.Connection, notes: list[tuple[str, str]], now: float) -> None:
    """Note ``(attempt_key, payload)`` pairs as open (inside the caller's transaction)."""
    conn.executemany(
        "INSERT OR REPLACE INTO open_attempts (key, payload, opened, orphaned_at) VALUES (?, ?, ?, NULL)",
        [(key, payload, now) for key, payload in notes],
    )


def close_notes(conn: sqlite3.Connection, keys: list[str]) -> None:
    """Close the notes of attempts whose rows are being appended (inside the caller's transaction)."""
    conn.executemany("DELETE FROM open_attempts WHERE key = ?", [(k,) for k in keys])


def take_orphans(conn: sqlite3.Connection) -> list[Orphan]:
    """Every note left open by an earlier process, stamped with that process's last sign of
    life. Call once, at start, before this process opens notes or beats: the stamp is kept,
    so a second crash before the orphans are recorded does not stretch their estimate over
    this process's lifetime. Notes whose attempt row already sits in the outbox (a crash
    after the row, before the note's removal) are dropped: that row is the truth."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT at FROM alive WHERE id = 1").fetchone()
        conn.execute("UPDATE open_attempts SET orphaned_at = max(opened, ?) WHERE orphaned_at IS NULL",
                     (row[0] if row else 0.0,))
        conn.execute("DELETE FROM open_attempts WHERE key IN (SELECT key FROM outbox WHERE kind = 'attempt')")
        found = conn.execute("SELECT key, payload, opened, orphaned_at FROM open_attempts ORDER BY opened").fetchall()
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return [Orphan(key, payload, opened, orphaned_at) for key, payload, opened, orphaned_at in found]
