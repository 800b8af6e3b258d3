"""Postgres dies mid-run (immediate shutdown: like a crash) and comes back: every row arrives, once.

Uses its own embedded Postgres in a tmp dir so the shared session server is untouched.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from _store_records import T0, attempt, task
from sqlalchemy import text

from taskplane.errors import UserError
from taskplane.ports import free_port
from taskplane.store import db, embedded
from taskplane.store.migrate import upgrade
from taskplane.store.records import TaskStatus
from taskplane.store.writer import CostWriter

N = 240


async def _counts(url: str) -> tuple[int, int, int, float]:
    engine = db.create_engine(url)
    try:
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT count(*), count(DISTINCT attempt_key), "
                        "(SELECT count(*) FROM tasks WHERE status = 'succeeded'), sum(cost_usd) FROM llm_calls"
                    )
                )
            ).one()
    finally:
        await engine.dispose()
    return int(row[0]), int(row[1]), int(row[2]), float(row[3])


def _restart(data_dir: Path, port: int, monkeypatch: pytest.MonkeyPatch) -> str:
    """``embedded.start`` on the stopped server's data dir.

    Known issue (reported to the lead): run as root, ``embedded.start`` makes an existing
    data dir group/other-traversable, which Postgres refuses ("invalid permissions").
    Only when that happens, restart with the data dir's own mode left alone.
    """
    try:
        return embedded.start(data_dir, port)
    except UserError as exc:
        if "invalid permissions" not in str(exc):
            raise
    original = embedded._make_traversable
    data_dir.resolve().chmod(0o700)
    with monkeypatch.context() as m:
        m.setattr(embedded, "_make_traversable", lambda path: original(path.parent))
        return embedded.start(data_dir, port)


async def test_postgres_killed_mid_run_loses_nothing_doubles_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not under tmp_path: pytest re-makes /tmp/pytest-of-<user> private (0700) whenever any
    # pytest session starts, which would lock the unprivileged postgres user out mid-test.
    pg_root = Path(tempfile.mkdtemp(prefix="taskplane-pg-outage-"))
    data_dir, port = pg_root / "data", free_port()
    url = await asyncio.to_thread(embedded.start, data_dir, port)
    try:
        await asyncio.to_thread(upgrade, url)
        records = [attempt(i, task=f"task-{i % 12}") for i in range(N)]
        seen_pending_while_down = 0
        async with CostWriter(url, tmp_path / "outbox", min_backoff_s=0.1, max_backoff_s=1.0) as writer:
            for k in range(12):
                await writer.upsert_task(task(f"task-{k}"))
            for i, rec in enumerate(records):
                if i == N // 3:
                    assert await writer.flush(timeout=30)  # the first third is in Postgres
                    await asyncio.to_thread(embedded.stop, data_dir, mode="immediate")
                await writer.record_attempt(rec)
                if i % 10 == 0:
                    await asyncio.sleep(0.02)  # let the sender try (and fail) while Postgres is down
                if i == 2 * N // 3:
                    seen_pending_while_down = writer.pending()
                    assert writer.stats()["postgres_ok"] is False
                    await asyncio.to_thread(_restart, data_dir, port, monkeypatch)
            for k in range(12):
                await writer.upsert_task(
                    task(f"task-{k}", status=TaskStatus.SUCCEEDED, finished_at=T0 + timedelta(minutes=2), deadline_met=True)
                )
            assert await writer.flush(timeout=120), writer.stats()
            assert writer.stats()["postgres_ok"] is True
        assert seen_pending_while_down > N // 4
        rows, distinct, succeeded, total = await _counts(url)
        assert rows == N and distinct == N
        assert succeeded == 12
        assert abs(total - sum(r.cost_usd for r in records)) < 1e-9
    finally:
        await asyncio.to_thread(embedded.destroy, data_dir)
        shutil.rmtree(pg_root, ignore_errors=True)
