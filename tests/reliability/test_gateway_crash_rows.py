"""A gateway killed with SIGKILL while a replica works on a call loses no cost row: the
attempt was journalled as open before it was sent, and the next gateway on the same
outbox records it (outcome ``error``, error type ``gateway_lost``, an estimated cost)
under the attempt_key it would have had, so nothing doubles if its real row got out."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from taskplane.calls import lost
from taskplane.dev import processes as proc
from taskplane.dev.local import LocalCluster
from taskplane.store.inflight import Orphan
from taskplane.store.outbox import FILE_NAME
from taskplane.store.records import GATEWAY_LOST, AttemptRecord, Outcome
from taskplane.store.writer import CostWriter

MODEL = "llama-3.1-8b"
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


async def _rows(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url.replace("+asyncpg", ""), timeout=10)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


def _open_notes(outbox_dir: Path) -> list[str]:
    conn = sqlite3.connect(outbox_dir / FILE_NAME)
    try:
        return [r[0] for r in conn.execute("SELECT key FROM open_attempts")]
    finally:
        conn.close()


def _call_headers(call_id: str) -> dict[str, str]:
    return {"X-Taskplane-Task-Id": "crash-task", "X-Taskplane-Call-Id": call_id, "X-Taskplane-Attempt": "1",
            "X-Taskplane-Tenant": "acme"}


def _body(text: str) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": text}]}


async def _wait_inflight(gateway_url: str, bound_s: float = 30) -> None:
    deadline = time.monotonic() + bound_s
    async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
        while time.monotonic() < deadline:
            reps = (await http.get(f"{gateway_url}/admin/replicas")).json()["replicas"]
            if sum(r["inflight"] for r in reps):
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the call never reached a replica")


async def _wait_row(url: str, key: str, bound_s: float = 60) -> None:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if await _rows(url, "SELECT 1 FROM llm_calls WHERE attempt_key = $1", key):
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"no row for {key} in Postgres")


async def _faults(urls: list[str], **body: Any) -> None:
    async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
        for u in urls:
            (await http.post(f"{u}/admin/faults", json=body)).raise_for_status()


async def test_an_attempt_in_flight_at_a_gateway_kill_is_recorded_once(fresh_db_url: str, tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, replicas=2, database_url=fresh_db_url)
    outbox = tmp_path / "outbox"  # LocalCluster's outbox_dir: the restarted gateway uses it too
    replica_urls = [r.url for r in cluster.replicas]
    with cluster:
        async with httpx.AsyncClient(base_url=cluster.gateway_url, timeout=60, trust_env=False) as http:
            done = await http.post("/v1/chat/completions", json=_body("a call that completes"),
                                   headers=_call_headers("done-call"))
            assert done.status_code == 200, done.text

            await _faults(replica_urls, hang=True)
            hanging = asyncio.ensure_future(http.post("/v1/chat/completions", json=_body("a call that hangs"),
                                                      headers=_call_headers("lost-call")))
            await _wait_inflight(cluster.gateway_url)
            await asyncio.sleep(2.0)  # the replica "works" on it; the writer's heartbeat stamps the outbox
            assert cluster.gateway_pid is not None
            os.killpg(cluster.gateway_pid, signal.SIGKILL)
            proc.stop_pid(cluster.gateway_pid, timeout_s=5)
            cluster.gateway_pid = None
            with contextlib.suppress(httpx.HTTPError):
                await hanging  # the client sees the connection drop (its activity would retry)
        await _faults(replica_urls, clear=True)
        assert _open_notes(outbox) == ["acme/lost-call:1:0"], "the dead gateway left its in-flight attempt journalled"

        await asyncio.to_thread(cluster.start_gateway)  # same config, same outbox directory
        await _wait_row(fresh_db_url, "acme/lost-call:1:0")
        assert await asyncio.to_thread(_open_notes, outbox) == []
        # a graceful restart and another call: the lost attempt is not recorded again
        await asyncio.to_thread(cluster.stop_gateway)
        await asyncio.to_thread(cluster.start_gateway)
        async with httpx.AsyncClient(base_url=cluster.gateway_url, timeout=60, trust_env=False) as http:
            after = await http.post("/v1/chat/completions", json=_body("a call after the restarts"),
                                    headers=_call_headers("after-call"))
            assert after.status_code == 200, after.text
        await _wait_row(fresh_db_url, "acme/after-call:1:0")

    rows = await _rows(fresh_db_url, "SELECT * FROM llm_calls WHERE task_id = 'crash-task' ORDER BY id")
    by_key: dict[str, list[asyncpg.Record]] = {}
    for r in rows:
        by_key.setdefault(r["attempt_key"], []).append(r)
    assert sorted(by_key) == ["acme/after-call:1:0", "acme/done-call:1:0", "acme/lost-call:1:0"], rows
    assert all(len(v) == 1 for v in by_key.values()), "no attempt is doubled"
    assert by_key["acme/done-call:1:0"][0]["outcome"] == "success"
    (row,) = by_key["acme/lost-call:1:0"]
    assert row["outcome"] == Outcome.ERROR.value and row["error_type"] == GATEWAY_LOST
    assert row["replica"] in {r.name for r in cluster.replicas} and row["gpu"] == "h100"
    assert row["model_requested"] == MODEL and row["tenant"] == "acme" and row["prompt_tokens"] > 0
    assert row["gpu_seconds"] > 0 and row["cost_usd"] > 0 and row["total_ms"] > 0


# ---- the estimate and the crash window, on the writer alone ---------------------------------


def _note(key: str = "call-1:1:0", **kw: Any) -> lost.AttemptNote:
    rec = AttemptRecord(attempt_key=key, task_id="task-1", tenant="acme", model_requested=MODEL, model_served=MODEL,
                        replica="replica-0", gpu="h100", prompt_tokens=120, outcome=Outcome.ERROR,
                        error_type=GATEWAY_LOST, started_at=T0)
    return lost.AttemptNote(record=rec, **{"timeout_s": 120.0, "price_per_hour_usd": 3.6, "batch_at_start": 2, **kw})


def test_the_estimate_runs_from_dispatch_to_the_last_sign_of_life_capped_by_the_timeout() -> None:
    start = T0.timestamp()

    def orphan(alive_after_s: float) -> Orphan:
        return Orphan("call-1:1:0", "", start, start + alive_after_s)

    rec = lost.lost_attempt(_note(), orphan(4.0))
    assert rec.total_ms == pytest.approx(4000.0)
    assert rec.gpu_seconds == pytest.approx(2.0)  # shared with the other call in the batch
    assert rec.cost_usd == pytest.approx(2.0 * 3.6 / 3600)
    assert rec.attempt_key == "call-1:1:0" and rec.error_type == GATEWAY_LOST and rec.outcome is Outcome.ERROR
    assert lost.lost_attempt(_note(timeout_s=3.0), orphan(600.0)).total_ms == pytest.approx(3000.0)
    assert lost.lost_attempt(_note(), orphan(-1.0)).cost_usd == 0.0


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql+asyncpg://postgres@127.0.0.1:{port}/taskplane"


def _crash_before_the_note_removal(outbox_dir: Path, key: str, payload: str) -> None:
    """The state a crash leaves between the row's commit and its note's removal: put the
    note back (today one transaction does both; this keeps recovery safe if that changes)."""
    conn = sqlite3.connect(outbox_dir / FILE_NAME, isolation_level=None)
    try:
        conn.execute("INSERT INTO open_attempts (key, payload, opened) VALUES (?, ?, ?)", (key, payload, time.time()))
    finally:
        conn.close()


def _success(key: str) -> AttemptRecord:
    return AttemptRecord(attempt_key=key, task_id="task-1", tenant="acme", model_requested=MODEL, model_served=MODEL,
                         replica="replica-0", gpu="h100", prompt_tokens=120, completion_tokens=8, total_ms=900.0,
                         gpu_seconds=0.45, cost_usd=0.00045, started_at=T0 + timedelta(seconds=1))


@pytest.mark.parametrize("delivered", [True, False], ids=["row-in-postgres", "row-still-in-outbox"])
async def test_a_crash_after_the_row_before_the_note_removal_doubles_nothing(fresh_db_url: str, tmp_path: Path,
                                                                             delivered: bool) -> None:
    key, note = "call-1:1:0", _note().model_dump_json()
    first_url = fresh_db_url if delivered else _dead_url()  # not delivered: Postgres unreachable for the first writer
    async with CostWriter(first_url, tmp_path, close_timeout_s=0.5) as writer:
        await writer.open_attempt(key, note)
        await writer.record_attempt(_success(key))
        assert await writer.flush(timeout=30 if delivered else 0.5) is delivered
    _crash_before_the_note_removal(tmp_path, key, note)

    async with CostWriter(fresh_db_url, tmp_path) as writer:
        recorded = await lost.record_orphans(writer, writer.record_attempt)
        # a row still in the outbox closes its note at start; one already in Postgres wins there
        assert len(recorded) == (1 if delivered else 0)
        assert await writer.flush(timeout=30)
    assert _open_notes(tmp_path) == []
    rows = await _rows(fresh_db_url, "SELECT outcome, cost_usd FROM llm_calls WHERE attempt_key = $1", key)
    assert [(r["outcome"], r["cost_usd"]) for r in rows] == [("success", pytest.approx(0.00045))]


async def test_an_orphan_is_recorded_once_across_restarts(fresh_db_url: str, tmp_path: Path) -> None:
    key, note = "call-2:1:0", _note("call-2:1:0").model_dump_json()
    async with CostWriter(fresh_db_url, tmp_path) as writer:
        await writer.open_attempt(key, note)
    # (closed without a row: as a SIGKILL would leave it)
    async with CostWriter(fresh_db_url, tmp_path) as writer:
        assert [o.key for o in writer.orphaned_attempts()] == [key]
        assert len(await lost.record_orphans(writer, writer.record_attempt)) == 1
        assert await writer.flush(timeout=30)
    async with CostWriter(fresh_db_url, tmp_path) as writer:
        assert writer.orphaned_attempts() == []
    rows = await _rows(fresh_db_url, "SELECT outcome, error_type FROM llm_calls WHERE attempt_key = $1", key)
    assert [(r["outcome"], r["error_type"]) for r in rows] == [("error", GATEWAY_LOST)]
