"""Every task gets its row, even one no worker ran; a worker refuses two activities with one
name. Real Temporal dev server and real Postgres."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import tp_sdk_agents as agents
import tp_sdk_tools as tools_mod
from temporalio.client import Client, WorkflowExecutionStatus
from tp_sdk_db import rows as _rows
from tp_sdk_recorder import Recorder
from tp_sdk_workers import serving_worker

import taskplane
from taskplane.errors import UserError
from taskplane.sdk.step import CLASHES, STEPS
from workflows.worker import TaskplaneWorker, build_worker


@pytest_asyncio.fixture(scope="module")
async def db_worker(tp_client: Client, recorder: Recorder, pg_url: str,
                    tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TaskplaneWorker]:
    """A worker with a database that serves tp_sdk_agents only (not tp_sdk_tools)."""
    async with serving_worker(tp_client, recorder.url, pg_url, ["tp_sdk_agents"], queue_prefix="sdk-rows",
                              outbox_dir=tmp_path_factory.mktemp("rows-outbox")) as worker:
        yield worker


async def _task_row(pg_url: str, task_id: str) -> dict[str, object]:
    found = await _rows(pg_url, "SELECT * FROM tasks WHERE task_id = :t", t=task_id)
    assert len(found) == 1, f"task {task_id} has {len(found)} rows"
    return found[0]


async def test_a_task_whose_agent_the_worker_lacks_fails_at_once_with_its_row(
    tp_client: Client, db_worker: TaskplaneWorker, pg_url: str
) -> None:
    # fire and forget: nobody waits on the handle, the worker's catch-all ends the task anyway
    handle = await taskplane.submit(tools_mod.named_tool, "Oslo", client=tp_client, task_queue=db_worker.task_queue,
                                    tenant="globex", deadline=60)
    desc = None
    for _ in range(150):
        desc = await handle.handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            break
        await asyncio.sleep(0.1)
    assert desc is not None and desc.status == WorkflowExecutionStatus.FAILED
    row = await _task_row(pg_url, handle.task_id)
    assert row["status"] == "failed" and row["agent"] == "tp_named_tool" and row["tenant"] == "globex"
    assert row["deadline_met"] is False and row["finished_at"] is not None and row["parent_task_id"] is None
    error = str(row["error"])
    for needle in ("'tp_named_tool'", repr(db_worker.task_queue), "taskplane worker -m tp_sdk_tools"):
        assert needle in error
    out = await handle.outcome()
    assert out.status == "failed" and out.failure_type == "AgentNotServed" and "tp_named_tool" in (out.error or "")
    assert await handle.status() == "failed"


async def test_a_task_on_a_queue_nobody_polls_gets_its_row_from_the_client(
    tp_client: Client, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKPLANE_DATABASE_URL", pg_url)
    queue = f"nobody-{uuid.uuid4().hex[:6]}"
    handle = await taskplane.submit(agents.simple, 1, client=tp_client, task_queue=queue, tenant="initech")
    out = await asyncio.wait_for(handle.outcome(), timeout=30)
    assert out.failure_type == "AgentNotServed"
    row = await _task_row(pg_url, handle.task_id)
    assert row["status"] == "failed" and row["agent"] == "tp_simple" and row["tenant"] == "initech"
    assert f"no worker polls task queue '{queue}'" in str(row["error"])
    # asked again: the same ending, still one row, not overwritten
    assert (await handle.outcome()).failure_type == "AgentNotServed"
    assert (await _task_row(pg_url, handle.task_id))["status"] == "failed"


async def test_the_client_never_overwrites_a_row_a_worker_finished(
    tp_client: Client, db_worker: TaskplaneWorker, pg_url: str
) -> None:
    from taskplane.sdk.unrun import record_unrun_task

    handle = await taskplane.submit(agents.simple, 1, client=tp_client, task_queue=db_worker.task_queue)
    await handle.result()
    assert not await record_unrun_task(handle.handle, "failed", "late guess", database_url=pg_url)
    row = await _task_row(pg_url, handle.task_id)
    assert row["status"] == "succeeded" and row["error"] is None


# --- activity names ------------------------------------------------------------------


@pytest.fixture
def step_registry() -> Iterator[None]:
    """Steps defined by the test are forgotten afterwards (other workers in the session must
    not see the clash this test makes on purpose)."""
    steps, clashes, mods = dict(STEPS), {k: list(v) for k, v in CLASHES.items()}, set(sys.modules)
    try:
        yield
    finally:
        STEPS.clear()
        STEPS.update(steps)
        CLASHES.clear()
        CLASHES.update(clashes)
        for name in set(sys.modules) - mods:
            if name.startswith("tp_clash_"):
                del sys.modules[name]


def _queue() -> str:
    return f"never-polled-{uuid.uuid4().hex[:8]}"  # a worker built (not run) still holds its queue


def _module(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text("from taskplane import agent, llm, step\n\n" + textwrap.dedent(body))
    return str(path)


# never called (the worker is refused before it runs); given because a framework adapter an
# earlier test imported (tests/examples) makes build_worker ask for one
UNUSED_GATEWAY = "http://127.0.0.1:9"

STEP = '''
@step
async def lookup(key: str) -> str:
    return key
'''


async def test_two_steps_with_one_name_are_refused_naming_both_modules(
    tp_client: Client, tmp_path: Path, step_registry: None
) -> None:
    a = _module(tmp_path, "tp_clash_a", STEP)
    b = _module(tmp_path, "tp_clash_b", STEP)
    with pytest.raises(UserError) as info:
        await build_worker(tp_client, UNUSED_GATEWAY, None, [a, b], task_queue=_queue(), include_examples=False)
    message = str(info.value)
    assert "'lookup'" in message and "tp_clash_a.lookup" in message and "tp_clash_b.lookup" in message
    assert "@step(name=" in message


async def test_a_step_named_like_a_built_in_activity_is_refused(
    tp_client: Client, tmp_path: Path, step_registry: None
) -> None:
    mod = _module(tmp_path, "tp_clash_builtin", '''
        @step(name="task_record")
        async def record(key: str) -> str:
            return key
    ''')
    with pytest.raises(UserError, match=r"'task_record' \(tp_clash_builtin.record and taskplane's built-in"):
        await build_worker(tp_client, UNUSED_GATEWAY, None, [mod], task_queue=_queue(), include_examples=False)


async def test_a_step_defined_again_by_its_own_module_is_no_clash(
    tp_client: Client, tmp_path: Path, step_registry: None
) -> None:
    import importlib

    mod = _module(tmp_path, "tp_clash_reload", STEP)
    worker = await build_worker(tp_client, UNUSED_GATEWAY, None, [mod], task_queue=_queue(), include_examples=False)
    await worker.resources.aclose()
    importlib.reload(sys.modules["tp_clash_reload"])  # the same function again: replaces, no clash
    assert "lookup" not in CLASHES
    worker = await build_worker(tp_client, UNUSED_GATEWAY, None, [mod], task_queue=_queue(), include_examples=False)
    await worker.resources.aclose()
