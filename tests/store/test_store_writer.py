"""CostWriter against real Postgres: idempotent, monotonic task status, replay, bad data."""

from __future__ import annotations

import asyncio
import socket
from datetime import timedelta
from pathlib import Path

import pytest
from _store_records import T0, attempt, task
from sqlalchemy import text

from taskplane.errors import UserError
from taskplane.store import db
from taskplane.store.outbox import ATTEMPT, Outbox
from taskplane.store.records import AttemptRecord, Outcome, TaskStatus
from taskplane.store.upserts import merge_task
from taskplane.store.writer import CostWriter


async def scalar(url: str, sql: str, **params: object) -> object:
    engine = db.create_engine(url)
    try:
        async with engine.connect() as conn:
            return (await conn.execute(text(sql), params)).scalar()
    finally:
        await engine.dispose()


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql+asyncpg://postgres@127.0.0.1:{port}/taskplane"


async def test_same_attempt_twice_and_replayed_is_one_row(fresh_db_url: str, tmp_path: Path) -> None:
    rec = attempt(1)
    async with CostWriter(fresh_db_url, tmp_path / "a") as writer:
        await writer.record_attempt(rec)
        await writer.record_attempt(rec)
        assert await writer.flush(timeout=30)
        assert writer.pending() == 0
    # a retried activity in another process records it again
    async with CostWriter(fresh_db_url, tmp_path / "b") as writer:
        await writer.record_attempt(rec)
        assert await writer.flush(timeout=30)
    assert await scalar(fresh_db_url, "SELECT count(*) FROM llm_calls") == 1
    assert await scalar(fresh_db_url, "SELECT cost_usd FROM llm_calls WHERE attempt_key = :k", k=rec.attempt_key) == pytest.approx(rec.cost_usd)


async def test_terminal_status_never_goes_back_to_running(fresh_db_url: str, tmp_path: Path) -> None:
    done = task(status=TaskStatus.SUCCEEDED, finished_at=T0 + timedelta(seconds=30), deadline_met=True,
                cost_usd=0.5, attempts=3, retries=1, deadline=None)
    async with CostWriter(fresh_db_url, tmp_path / "o") as writer:
        # in one batch: running, terminal, a late running
        await asyncio.gather(writer.upsert_task(task()), writer.upsert_task(done), writer.upsert_task(task()))
        assert await writer.flush(timeout=30)
        # across batches: a late running upsert after the terminal one
        await writer.upsert_task(task(started_at=T0 + timedelta(seconds=5)))
        assert await writer.flush(timeout=30)
    status = await scalar(fresh_db_url, "SELECT status FROM tasks WHERE task_id = 'task-1'")
    deadline = await scalar(fresh_db_url, "SELECT deadline FROM tasks WHERE task_id = 'task-1'")
    attempts = await scalar(fresh_db_url, "SELECT attempts FROM tasks WHERE task_id = 'task-1'")
    assert status == "succeeded"
    assert deadline == T0 + timedelta(minutes=5)  # the terminal row had none: not erased
    assert attempts == 3
    # a later terminal status wins (last writer wins among terminal statuses)
    async with CostWriter(fresh_db_url, tmp_path / "o") as writer:
        await writer.upsert_task(task(status=TaskStatus.CANCELLED, finished_at=T0 + timedelta(seconds=40)))
        assert await writer.flush(timeout=30)
    assert await scalar(fresh_db_url, "SELECT status FROM tasks WHERE task_id = 'task-1'") == "cancelled"


def test_merge_task_matches_the_sql_rule() -> None:
    running, done = task(), task(status=TaskStatus.FAILED, finished_at=T0 + timedelta(seconds=9), deadline=None)
    assert merge_task(done, running) is done
    merged = merge_task(running, done)
    assert merged.status is TaskStatus.FAILED and merged.deadline == running.deadline


async def test_concurrent_writers_write_each_row_once(fresh_db_url: str, tmp_path: Path) -> None:
    records = [attempt(i, task=f"t{i % 7}") for i in range(300)]
    tasks_done = [task(f"t{k}", status=TaskStatus.SUCCEEDED, finished_at=T0 + timedelta(minutes=1)) for k in range(7)]

    async def run(name: str) -> None:
        async with CostWriter(fresh_db_url, tmp_path / name, batch_size=37) as writer:
            await asyncio.gather(*(writer.record_attempt(r) for r in records))
            for k in range(7):
                await writer.upsert_task(task(f"t{k}"))
            for t in tasks_done:
                await writer.upsert_task(t)
            for k in range(7):
                await writer.upsert_task(task(f"t{k}"))  # a stale start replayed last
            assert await writer.flush(timeout=60)

    await asyncio.gather(run("w1"), run("w2"), run("w3"))
    assert await scalar(fresh_db_url, "SELECT count(*) FROM llm_calls") == 300
    assert await scalar(fresh_db_url, "SELECT count(DISTINCT attempt_key) FROM llm_calls") == 300
    total = await scalar(fresh_db_url, "SELECT sum(cost_usd) FROM llm_calls")
    assert total == pytest.approx(sum(r.cost_usd for r in records))
    assert await scalar(fresh_db_url, "SELECT count(*) FROM tasks WHERE status = 'succeeded'") == 7


async def test_rows_wait_in_the_outbox_and_replay_on_restart(fresh_db_url: str, tmp_path: Path) -> None:
    outbox = tmp_path / "outbox"
    writer = CostWriter(dead_url(), outbox, max_backoff_s=0.5, close_timeout_s=0.2)
    await writer.start()
    for i in range(50):
        await writer.record_attempt(attempt(i))
    await writer.upsert_task(task(status=TaskStatus.FAILED, finished_at=T0 + timedelta(minutes=1)))
    assert not await writer.flush(timeout=1.0)
    assert writer.pending() == 51
    assert writer.stats()["postgres_ok"] is False and writer.stats()["last_error"]
    await writer.close()
    assert Outbox(outbox).path.exists()

    async with CostWriter(fresh_db_url, outbox) as writer2:
        assert writer2.pending() == 51
        assert await writer2.flush(timeout=30)
        assert writer2.stats()["written"] == 51
    assert await scalar(fresh_db_url, "SELECT count(*) FROM llm_calls") == 50
    assert await scalar(fresh_db_url, "SELECT status FROM tasks") == "failed"


async def test_crash_between_commit_and_delete_does_not_double(fresh_db_url: str, tmp_path: Path) -> None:
    records = [attempt(i) for i in range(20)]
    async with CostWriter(fresh_db_url, tmp_path / "o") as writer:
        for r in records:
            await writer.record_attempt(r)
        assert await writer.flush(timeout=30)
    # The process died after Postgres committed but before the outbox forgot the rows.
    box = Outbox(tmp_path / "o")
    box.open()
    box.append_many([("attempt", r.attempt_key, r.model_dump_json()) for r in records])
    box.close()
    async with CostWriter(fresh_db_url, tmp_path / "o") as writer:
        assert writer.pending() == 20
        assert await writer.flush(timeout=30)
    assert await scalar(fresh_db_url, "SELECT count(*) FROM llm_calls") == 20


async def test_bad_row_is_buried_not_blocking(fresh_db_url: str, tmp_path: Path) -> None:
    good = [attempt(i) for i in range(5)]
    bad = attempt(99, step=2**40)  # overflows the integer column: Postgres rejects the value
    async with CostWriter(fresh_db_url, tmp_path / "o") as writer:
        for r in [*good[:2], bad, *good[2:]]:
            await writer.record_attempt(r)
        assert await writer.flush(timeout=30)
        assert writer.stats()["dead"] == 1
    assert await scalar(fresh_db_url, "SELECT count(*) FROM llm_calls") == 5
    box = Outbox(tmp_path / "o")
    box.open()
    assert box.dead_count() == 1 and box.count() == 0
    box.close()


async def test_one_writer_per_outbox(tmp_path: Path) -> None:
    async with CostWriter(dead_url(), tmp_path / "o", close_timeout_s=0.1):
        second = CostWriter(dead_url(), tmp_path / "o")
        with pytest.raises(UserError, match="in use by another writer"):
            await second.start()


async def test_not_started_is_a_clear_error(tmp_path: Path) -> None:
    writer = CostWriter(dead_url(), tmp_path / "o")
    with pytest.raises(RuntimeError, match="not started"):
        await writer.record_attempt(attempt(1))


def test_outcome_enum_round_trips() -> None:
    rec = attempt(1, outcome=Outcome.SHED, cost_usd=0.0)
    assert AttemptRecord.model_validate_json(rec.model_dump_json()) == rec


async def _rows_arrive(url: str, n: int, within_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while await scalar(url, "SELECT count(*) FROM llm_calls") != n:
        assert asyncio.get_running_loop().time() < deadline, "rows did not reach Postgres"
        await asyncio.sleep(0.05)


async def test_rows_recorded_one_by_one_reach_postgres_in_one_transaction_per_window(fresh_db_url: str, tmp_path: Path) -> None:
    """Each append is its own outbox commit (and wakes the sender); the sender still gathers
    them for its window and delivers them together, not one transaction per row."""
    async with CostWriter(fresh_db_url, tmp_path / "o", send_window_s=5.0) as writer:
        for i in range(30):
            await writer.record_attempt(attempt(i))
        await _rows_arrive(fresh_db_url, 30)
        assert writer.stats()["written"] == 30
        assert writer.stats()["batches"] <= 2  # one window, or the first row's wake and one more


async def test_flush_does_not_wait_for_the_send_window(fresh_db_url: str, tmp_path: Path) -> None:
    async with CostWriter(fresh_db_url, tmp_path / "o", send_window_s=600.0) as writer:
        await writer.record_attempt(attempt(1))
        await asyncio.sleep(0.2)  # the sender is gathering now
        assert await writer.flush(timeout=30)
        await writer.record_attempt(attempt(2))
        assert await writer.flush(timeout=30)
    assert await scalar(fresh_db_url, "SELECT count(*) FROM llm_calls") == 2


async def test_an_outbox_row_from_before_adapters_loads_as_the_base_model(fresh_db_url: str, tmp_path: Path) -> None:
    """Rows spooled by an older gateway have no ``adapter`` field: delivered, they name none."""
    outbox = Outbox(tmp_path / "outbox")
    old, new = attempt(1), attempt(2).model_copy(update={"adapter": "tenant-a"})
    old_payload = old.model_dump_json(exclude={"adapter"})
    assert '"adapter"' not in old_payload
    outbox.open()
    outbox.append_many([(ATTEMPT, old.attempt_key, old_payload), (ATTEMPT, new.attempt_key, new.model_dump_json())])
    outbox.close()
    async with CostWriter(fresh_db_url, tmp_path / "outbox") as writer:
        assert await writer.flush(timeout=30)
    assert await scalar(fresh_db_url, f"SELECT count(*) FROM llm_calls WHERE attempt_key = '{old.attempt_key}' "
                                      "AND adapter IS NULL") == 1
    assert await scalar(fresh_db_url, f"SELECT adapter FROM llm_calls WHERE attempt_key = '{new.attempt_key}'") == "tenant-a"
