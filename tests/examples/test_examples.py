"""The three example agents, each run end to end: through `taskplane run` (a real CLI
process) and through submit() with the worker's default registration, on the real
Temporal dev server, gateway, simulated replicas and Postgres."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import text
from temporalio.client import Client

import taskplane
from examples.coding import CodingResult, coding_agent
from examples.research import Report, research_agent
from examples.triage import Triage, triage_agent
from taskplane.dev.local import LocalCluster
from taskplane.sdk.client import taskplane_client
from taskplane.store.db import create_engine
from workflows.worker import TaskplaneWorker, build_worker


@pytest_asyncio.fixture(scope="module")
async def ex_worker(temporal_env: Any, ex_cluster: LocalCluster, pg_url: str, tmp_path_factory: pytest.TempPathFactory
                    ) -> AsyncIterator[TaskplaneWorker]:
    """The worker as `taskplane worker` builds it: no --module, the examples by default."""
    worker = await build_worker(taskplane_client(temporal_env.client), ex_cluster.gateway_url, pg_url, [],
                                task_queue=f"examples-{uuid.uuid4().hex[:8]}",
                                outbox_dir=tmp_path_factory.mktemp("ex-outbox"))
    assert {"research", "coding", "triage", "triage-account", "triage-reply"} <= {a.name for a in worker.agents}
    async with worker:
        yield worker


async def _task_row(pg_url: str, task_id: str) -> dict[str, Any]:
    engine = create_engine(pg_url, pool_size=1)
    try:
        async with engine.connect() as conn:
            row = (await conn.execute(text("SELECT * FROM tasks WHERE task_id = :t"), {"t": task_id})).one()
            return dict(row._mapping)
    finally:
        await engine.dispose()


def _run_cli(temporal_env: Any, cluster: LocalCluster, pg_url: str, tmp_path: Any, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TASKPLANE_TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
           "TASKPLANE_GATEWAY_URL": cluster.gateway_url, "TASKPLANE_DATABASE_URL": pg_url,
           "TASKPLANE_STATE_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "taskplane.cli", "run", *argv], env=env, capture_output=True,
                          text=True, timeout=240, cwd=tmp_path)


@pytest.mark.parametrize(
    ("target", "argv"),
    [
        ("examples.research:research_agent", ["--arg", "How does KV-cache-aware routing cut cost?"]),
        ("examples.coding:coding_agent", ["--arg", "make test_parser pass", "--arg", "16", "--arg", "0.05"]),
        ("examples.triage:triage_agent", ["--arg", "I was charged twice and cannot log in"]),
    ],
)
def test_each_example_runs_with_one_command(
    temporal_env: Any, ex_cluster: LocalCluster, pg_url: str, tmp_path: Any, target: str, argv: list[str]
) -> None:
    done = _run_cli(temporal_env, ex_cluster, pg_url, tmp_path, target, *argv)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result
    assert "succeeded" in done.stderr and "cost $" in done.stderr


def test_run_command_reports_a_bad_target(temporal_env: Any, ex_cluster: LocalCluster, pg_url: str, tmp_path: Any) -> None:
    done = _run_cli(temporal_env, ex_cluster, pg_url, tmp_path, "examples.research:CORPUS")
    assert done.returncode != 0 and "not an @agent function" in done.stderr


async def test_research_agent(temporal_env: Any, ex_worker: TaskplaneWorker, pg_url: str) -> None:
    client: Client = taskplane_client(temporal_env.client)
    handle = await taskplane.submit(research_agent, "Why does prefix-aware routing lower cost per task?",
                                    client=client, task_queue=ex_worker.task_queue)
    report = await handle.result()
    assert isinstance(report, Report)
    assert len(report.queries) == 3 and len(report.notes) == 3 and report.summary
    assert "prefix-routing" in report.sources
    out = await handle.outcome()
    assert out.llm_calls == 5 and out.cost_usd > 0
    row = await _task_row(pg_url, handle.task_id)
    assert row["status"] == "succeeded" and row["agent"] == "research" and row["tenant"] == "acme"
    assert row["cost_usd"] == pytest.approx(out.cost_usd)


async def test_coding_agent_loops_with_growing_context_and_continues_as_new(
    temporal_env: Any, ex_worker: TaskplaneWorker
) -> None:
    client: Client = taskplane_client(temporal_env.client)
    task = "make test_parser pass"
    handle = await taskplane.submit(coding_agent, task, 16, 0.05, client=client, task_queue=ex_worker.task_queue)
    result = await handle.result()
    assert isinstance(result, CodingResult)
    assert result.passed and result.failures[-1] == 0 and result.iterations >= 6
    assert result.failures == sorted(result.failures, reverse=True)
    runs = [wf async for wf in client.list_workflows(f"WorkflowId = '{handle.task_id}'")]
    assert len(runs) >= 2  # the long loop continued as new, and still finished as one task
    state = await handle.state()
    assert state.llm_calls == result.iterations and state.session_id == handle.task_id


async def test_triage_agent_spawns_sub_agents(temporal_env: Any, ex_worker: TaskplaneWorker, pg_url: str) -> None:
    client: Client = taskplane_client(temporal_env.client)
    handle = await taskplane.submit(triage_agent, "I was charged twice for March", "bob@example.com",
                                    client=client, task_queue=ex_worker.task_queue, tenant="globex")
    triage = await handle.result()
    assert isinstance(triage, Triage)
    assert triage.category == "billing" and triage.account.startswith("free customer") and triage.reply
    children = [wf async for wf in client.list_workflows(f"WorkflowId STARTS_WITH '{handle.task_id}.'")]
    assert sorted(wf.workflow_type for wf in children) == ["triage-account", "triage-reply"]
    for wf in children:
        # part of the goal, not tasks of their own: a TaskplaneTenant filter lists the goal only
        assert wf.typed_search_attributes.get(taskplane.temporal_names.TENANT) is None
    out = await handle.outcome()
    assert out.llm_calls == 5  # its own 2 and the sub-agents' 3, rolled up (as its cost is)
    row = await _task_row(pg_url, handle.task_id)
    assert row["cost_usd"] == pytest.approx(out.cost_usd) and row["tenant"] == "globex"
