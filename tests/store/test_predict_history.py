"""The prediction layer seeded from Postgres history at start-up."""

from __future__ import annotations

from datetime import timedelta

import pytest
from _store_records import T0, attempt, task

from taskplane.scheduler.predict import Predictor
from taskplane.store import db
from taskplane.store.predict_history import seed_predictor, task_histories
from taskplane.store.records import Outcome, TaskStatus
from taskplane.store.upserts import write_records


async def test_seeded_predictor_knows_the_agents_task_lengths(fresh_db_url: str) -> None:
    engine = db.create_engine(fresh_db_url)
    try:
        calls, tasks = [], []
        for n in range(12):
            tid = f"t{n}"
            for i in range(4):  # 4 successful calls, 2 s apart, 300 ms each: gaps of 1.7 s
                calls.append(attempt(i, task=tid, started_at=T0 + timedelta(minutes=n, seconds=2 * i),
                                     completion_tokens=40))
            calls.append(attempt(9, task=tid, outcome=Outcome.ERROR, attempt_key=f"{tid}:bad"))  # not a call made
            tasks.append(task(tid, status=TaskStatus.SUCCEEDED, finished_at=T0 + timedelta(minutes=n, seconds=9)))
        tasks.append(task("running"))  # unfinished: no length yet
        calls.append(attempt(0, task="running"))
        await write_records(engine, calls, tasks)

        hist = await task_histories(engine, since=T0 - timedelta(days=1))
        assert len(hist) == 12 and {h.calls for h in hist} == {4}
        assert hist[0].output_tokens == (40, 40, 40, 40)
        assert [g for _, g in hist[0].gaps_s] == pytest.approx([1.7, 1.7, 1.7])

        cold = Predictor()
        assert not cold.session_end("triage", "acme", 3).usable(0.5)
        warm = Predictor()
        assert await seed_predictor(warm, engine, since=T0 - timedelta(days=1)) == 12
        end = warm.session_end("triage", "acme", 3)
        assert end.value == pytest.approx(1.0) and end.usable(0.5)
        assert warm.steps_left("triage", "acme", 0).value == pytest.approx(3.0)
        assert warm.tool_gap("triage", None).value == pytest.approx(1.7)
        assert await task_histories(engine, since=T0 + timedelta(days=1)) == []
    finally:
        await engine.dispose()


async def test_the_gateway_seeds_its_pipeline_at_start_up(fresh_db_url: str) -> None:
    from types import SimpleNamespace

    from taskplane.calls.wiring import seed_predictions
    from taskplane.scheduler.policies import build_policy

    engine = db.create_engine(fresh_db_url)
    try:
        calls = [attempt(i, task=f"t{n}") for n in range(8) for i in range(3)]
        await write_records(engine, calls, [task(f"t{n}", status=TaskStatus.SUCCEEDED, finished_at=T0) for n in range(8)])
    finally:
        await engine.dispose()
    placer = SimpleNamespace(scheduler=build_policy("taskplane", metrics=False))
    assert await seed_predictions(placer, fresh_db_url) == 8
    predictor = placer.scheduler.pipeline.handle.predictor
    assert predictor.steps_left("triage", "acme", 0).value == pytest.approx(2.0)
    assert await seed_predictions(placer, None) == 0
    assert await seed_predictions(placer, "postgresql+asyncpg://nobody@127.0.0.1:1/none") == 0  # away: live only
