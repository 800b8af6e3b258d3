"""Repository queries against real Postgres, and the pure cost model."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from _store_records import T0, attempt, task

from taskplane.store import db, repo
from taskplane.store.pricing import PriceEntry, attributed_gpu_seconds, call_cost_usd
from taskplane.store.records import Outcome, TaskStatus
from taskplane.store.upserts import write_records


async def test_task_spend_and_rows(fresh_db_url: str) -> None:
    engine = db.create_engine(fresh_db_url)
    try:
        calls = [
            attempt(0, task="t1", cost_usd=0.01),
            attempt(1, task="t1", cost_usd=0.02, outcome=Outcome.ERROR, attempt_key="t1:1:a1"),
            attempt(1, task="t1", cost_usd=0.03, attempt=2, attempt_key="t1:1:a2"),
            attempt(2, task="t2", cost_usd=0.5, tenant="globex", started_at=T0 + timedelta(hours=2)),
        ]
        await write_records(engine, calls, [task("t1", status=TaskStatus.SUCCEEDED, finished_at=T0 + timedelta(minutes=1)),
                                            task("t2", tenant="globex", started_at=T0 + timedelta(hours=2))])
        spend = await repo.task_spend(engine, "t1")
        assert spend.cost_usd == pytest.approx(0.06)
        assert (spend.attempts, spend.failed_attempts) == (3, 1)
        assert (await repo.task_spend(engine, "nope")).attempts == 0
        got = await repo.get_task(engine, "t1")
        assert got is not None and got.status is TaskStatus.SUCCEEDED and got.started_at == T0
        assert await repo.get_task(engine, "nope") is None
        assert [a.attempt_key for a in await repo.task_attempts(engine, "t1")][-1] == "t1:1:a2"

        a, t = await repo.report_rows(engine, since=T0, until=T0 + timedelta(hours=1))
        assert {x.task_id for x in a} == {"t1"} and {x.task_id for x in t} == {"t1"}
        a, t = await repo.report_rows(engine, tenant="globex")
        assert [x.task_id for x in a] == ["t2"] and [x.task_id for x in t] == ["t2"]
        # the task of an in-window attempt comes along even when the task ended later
        late_end = task("t3", status=TaskStatus.FAILED, finished_at=T0 + timedelta(days=3))
        await write_records(engine, [attempt(5, task="t3")], [late_end])
        a, t = await repo.report_rows(engine, since=T0, until=T0 + timedelta(hours=1))
        assert "t3" in {x.task_id for x in t}
    finally:
        await engine.dispose()


async def test_price_book_versions(fresh_db_url: str) -> None:
    engine = db.create_engine(fresh_db_url)
    try:
        seed = await repo.price_for(engine, "h100")
        assert seed is not None and seed.version == 1 and seed.cost_per_hour_usd == 2.5
        assert len(await repo.price_book(engine, version=1)) >= 5
        future = datetime.now(UTC) + timedelta(days=1)
        v2, v3 = await asyncio.gather(
            repo.add_price_version(engine, [PriceEntry("h100", 2.0)], valid_from=future),
            repo.add_price_version(engine, [PriceEntry("api-gpt", usd_per_prompt_token=1e-6, usd_per_completion_token=4e-6)]),
        )
        assert sorted([v2, v3]) == [2, 3]
        now_price = await repo.price_for(engine, "h100")
        assert now_price is not None and now_price.version == 1  # the cheaper price is not valid yet
        later = await repo.price_for(engine, "h100", at=future + timedelta(hours=1))
        assert later is not None and later.cost_per_hour_usd == 2.0
        api = await repo.price_for(engine, "api-gpt")
        assert api is not None and api.per_token
        assert await repo.price_for(engine, "tpu") is None
    finally:
        await engine.dispose()


def test_cost_model() -> None:
    # 0.2 s prefill alone + 2 s decode in a batch of 8 = 0.45 GPU-seconds
    gpu_s = attributed_gpu_seconds(0.2, 2.0, decode_batch_size=8)
    assert gpu_s == pytest.approx(0.45)
    assert call_cost_usd(PriceEntry("h100", 3.6), gpu_seconds=gpu_s) == pytest.approx(0.00045)
    api = PriceEntry("api", usd_per_prompt_token=1e-6, usd_per_cached_token=1e-7, usd_per_completion_token=4e-6)
    cost = call_cost_usd(api, gpu_seconds=99, prompt_tokens=1000, cached_tokens=600, completion_tokens=100)
    assert cost == pytest.approx(400e-6 + 600e-7 + 400e-6)
    assert attributed_gpu_seconds(-1, 1, decode_batch_size=0) == 1.0
