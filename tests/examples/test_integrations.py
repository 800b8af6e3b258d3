"""The framework adapters end to end with the frameworks' own packages: an OpenAI Agents SDK
agent and a Pydantic AI agent, each run as a taskplane task on the real Temporal dev
server, gateway, simulated replicas and Postgres. Offline: the models are the gateway's."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import text
from temporalio.client import Client

import taskplane
from taskplane import temporal_names as tn
from taskplane.dev.local import LocalCluster
from taskplane.sdk.client import taskplane_client
from taskplane.store.db import create_engine
from workflows.worker import TaskplaneWorker, build_worker


async def _rows(pg_url: str, sql: str, **kw: object) -> list[dict[str, Any]]:
    engine = create_engine(pg_url, pool_size=1)
    try:
        async with engine.connect() as conn:
            return [dict(r._mapping) for r in (await conn.execute(text(sql), kw)).all()]
    finally:
        await engine.dispose()


@pytest_asyncio.fixture(scope="module")
async def oa_worker(temporal_env: Any, ex_cluster: LocalCluster, pg_url: str,
                    tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TaskplaneWorker]:
    worker = await build_worker(taskplane_client(temporal_env.client), ex_cluster.gateway_url, pg_url,
                                ["examples.openai_agents_weather"], task_queue=f"oa-{uuid.uuid4().hex[:8]}",
                                include_examples=False, outbox_dir=tmp_path_factory.mktemp("oa-outbox"))
    async with worker:
        yield worker


async def test_openai_agents_task_gets_row_status_attributes_and_headers(
    temporal_env: Any, oa_worker: TaskplaneWorker, pg_url: str
) -> None:
    from examples.openai_agents_weather import weather_task

    client: Client = taskplane_client(temporal_env.client)
    handle = await taskplane.submit(weather_task, "What is the weather in Oslo?", client=client,
                                    task_queue=oa_worker.task_queue)
    answer = await handle.result()
    assert isinstance(answer, str) and answer
    out = await handle.outcome()
    assert out.status == "succeeded" and out.llm_calls == 2 and out.cost_usd > 0  # tool call, then the answer
    calls = await _rows(pg_url, "SELECT * FROM llm_calls WHERE task_id = :t ORDER BY step", t=handle.task_id)
    assert [c["step"] for c in calls] == [0, 1]  # the task's context headers reached the gateway
    assert {c["tenant"] for c in calls} == {"acme"} and {c["agent"] for c in calls} == {"oa-weather"}
    row = (await _rows(pg_url, "SELECT * FROM tasks WHERE task_id = :t", t=handle.task_id))[0]
    assert row["status"] == "succeeded" and row["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls))
    sa = (await handle.handle.describe()).typed_search_attributes
    assert sa.get(tn.STATUS) == "succeeded" and sa.get(tn.LLM_CALLS) == 2 and sa.get(tn.TENANT) == "acme"
    names = []
    async for ev in handle.handle.fetch_history_events():
        if ev.HasField("activity_task_scheduled_event_attributes"):
            names.append(ev.activity_task_scheduled_event_attributes.activity_type.name)
    assert "get_weather" in names and names.count("taskplane_openai_agents_model") == 2


@pytest_asyncio.fixture(scope="module")
async def pa_worker(temporal_env: Any, ex_cluster: LocalCluster, pg_url: str,
                    tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TaskplaneWorker]:
    worker = await build_worker(taskplane_client(temporal_env.client), ex_cluster.gateway_url, pg_url,
                                ["examples.pydantic_ai_weather"], task_queue=f"pa-{uuid.uuid4().hex[:8]}",
                                include_examples=False, outbox_dir=tmp_path_factory.mktemp("pa-outbox"))
    async with worker:
        yield worker


async def test_pydantic_ai_task_gets_row_status_attributes_and_headers(
    temporal_env: Any, pa_worker: TaskplaneWorker, pg_url: str
) -> None:
    from examples.pydantic_ai_weather import pa_weather_task

    client: Client = taskplane_client(temporal_env.client)
    handle = await taskplane.submit(pa_weather_task, "What is the weather in Rome?", client=client,
                                    task_queue=pa_worker.task_queue)
    answer = await handle.result()
    assert isinstance(answer, str) and answer
    out = await handle.outcome()
    assert out.status == "succeeded" and out.llm_calls == 2 and out.cost_usd > 0  # tool call, then the answer
    calls = await _rows(pg_url, "SELECT * FROM llm_calls WHERE task_id = :t ORDER BY step", t=handle.task_id)
    assert [c["step"] for c in calls] == [0, 1]
    assert {c["tenant"] for c in calls} == {"acme"} and {c["agent"] for c in calls} == {"pa-weather"}
    row = (await _rows(pg_url, "SELECT * FROM tasks WHERE task_id = :t", t=handle.task_id))[0]
    assert row["status"] == "succeeded" and row["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls))
    sa = (await handle.handle.describe()).typed_search_attributes
    assert sa.get(tn.STATUS) == "succeeded" and sa.get(tn.LLM_CALLS) == 2
