"""The dev loop never hangs silently: unserved agents fail fast with the fix, deadlines
end tasks at the deadline, outcome() works for every ending, cost() is live, sub-agents
roll up, `taskplane worker` imports from the current directory. Real Temporal dev server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import tp_sdk_agents as agents
import tp_sdk_devloop as devloop
import tp_sdk_tools as tools_mod
from temporalio.client import Client, WorkflowExecutionStatus
from tp_sdk_db import wait_status
from tp_sdk_recorder import Recorder
from tp_sdk_workers import serving_worker

import taskplane
from taskplane import temporal_names as tn
from taskplane.sdk import TaskFailed
from taskplane.sdk.spec import DEADLINE_GRACE
from workflows.worker import TaskplaneWorker


@pytest_asyncio.fixture(scope="module")
async def dev_worker(tp_client: Client, recorder: Recorder) -> AsyncIterator[TaskplaneWorker]:
    async with serving_worker(tp_client, recorder.url, None, ["tp_sdk_devloop"], queue_prefix="sdk-dev") as worker:
        yield worker


async def test_an_agent_no_worker_serves_fails_within_seconds_naming_the_fix(
    tp_client: Client, rec_worker: TaskplaneWorker
) -> None:
    # rec_worker polls this queue but does not import tp_sdk_tools: "not registered"
    t0 = time.monotonic()
    handle = await taskplane.submit(tools_mod.named_tool, "Oslo", client=tp_client, task_queue=rec_worker.task_queue)
    out = await asyncio.wait_for(handle.outcome(), timeout=30)
    print(f"unserved agent: failed after {time.monotonic() - t0:.2f} s: {out.error}")
    assert time.monotonic() - t0 < 30
    assert out.status == "failed" and out.failure_type == "AgentNotServed"
    assert out.error is not None
    for needle in ("'tp_named_tool'", repr(rec_worker.task_queue), "taskplane worker -m tp_sdk_tools"):
        assert needle in out.error
    with pytest.raises(TaskFailed, match="tp_named_tool"):
        await handle.result()  # asked again: the same reason
    assert (await handle.outcome()).failure_type == "AgentNotServed"
    # the worker's catch-all failed it (with its task row: test_sdk_task_rows), no client had to
    assert (await handle.handle.describe()).status == WorkflowExecutionStatus.FAILED


async def test_a_queue_nobody_polls_fails_too(tp_client: Client) -> None:
    queue = f"nobody-{uuid.uuid4().hex[:6]}"
    handle = await taskplane.submit(agents.simple, 1, client=tp_client, task_queue=queue)
    out = await asyncio.wait_for(handle.outcome(), timeout=30)
    assert out.failure_type == "AgentNotServed" and f"no worker polls task queue '{queue}'" in (out.error or "")


async def test_execution_timeout_is_deadline_plus_grace(tp_client: Client, rec_worker: TaskplaneWorker) -> None:
    handle = await taskplane.submit(agents.simple, 1, client=tp_client, task_queue=rec_worker.task_queue, deadline=40)
    desc = await handle.handle.describe()
    timeout = desc.raw_description.execution_config.workflow_execution_timeout.ToSeconds()
    assert 40 < timeout <= 40 + DEADLINE_GRACE.total_seconds() + 1
    await handle.result()


@pytest.mark.parametrize("agent_fn", [devloop.sleeper, devloop.slow_tool_agent])
async def test_a_deadline_ends_the_task_whatever_it_is_doing(
    tp_client: Client, dev_worker: TaskplaneWorker, agent_fn: Any
) -> None:
    handle = await taskplane.submit(agent_fn, 60.0, client=tp_client, task_queue=dev_worker.task_queue)
    out = await handle.outcome()
    assert out.status == "failed-deadline" and out.failure_type == "DeadlineExceeded"
    desc = await handle.handle.describe()
    assert desc.close_time is not None and desc.start_time is not None
    # the 3 s deadline ended it, not the 60 s sleep
    took = (desc.close_time - desc.start_time).total_seconds()
    print(f"{agent_fn.name}: 3 s deadline, 60 s body, ended after {took:.2f} s")
    assert took < 30
    assert await handle.status() == "failed-deadline"


async def test_a_task_cancelled_during_a_tool_ends_cancelled_not_step_failed(
    tp_client: Client, dev_worker: TaskplaneWorker
) -> None:
    # the deadline timer ends a body the same way: by cancelling it while the tool runs
    handle = await taskplane.submit(devloop.long_tool_agent, 60.0, client=tp_client, task_queue=dev_worker.task_queue)
    for _ in range(200):
        if (await handle.state()).current == "tool slow_tool":
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # the tool's activity is running on the worker
    await handle.cancel()
    out = await asyncio.wait_for(handle.outcome(), timeout=30)
    assert (out.status, out.failure_type) == ("cancelled", "Cancelled")


async def test_outcome_for_failed_and_cancelled_tasks(tp_client: Client, rec_worker: TaskplaneWorker) -> None:
    failed = await taskplane.submit(agents.budget_agent, 10, client=tp_client, task_queue=rec_worker.task_queue)
    out = await failed.outcome()
    assert out.status == "failed" and out.failure_type == "BudgetExceeded" and out.result is None
    assert out.llm_calls >= 3 and out.attempts >= out.llm_calls and out.cost_usd > 0.0025

    waiting = await taskplane.submit(agents.approver, "v9", client=tp_client, task_queue=rec_worker.task_queue)
    await wait_status(waiting, "waiting-approval")
    live = await waiting.cost()
    assert live > 0 and live == pytest.approx((await waiting.state()).cost_usd)  # current, not lagging
    await waiting.cancel()
    out = await waiting.outcome()
    assert out.status == "cancelled" and out.llm_calls == 1 and out.cost_usd == pytest.approx(live)


async def test_sub_agents_roll_up_into_the_parent(tp_client: Client, rec_worker: TaskplaneWorker) -> None:
    handle = await taskplane.submit(agents.context_agent, "roll up", client=tp_client, task_queue=rec_worker.task_queue)
    await handle.result()
    out = await handle.outcome()
    assert out.llm_calls == 5 and out.attempts == 5  # 3 own + the sub-agent's 2
    desc = await handle.handle.describe()
    assert desc.typed_search_attributes.get(tn.LLM_CALLS) == 5
    children = [wf async for wf in tp_client.list_workflows(f"WorkflowId STARTS_WITH '{handle.task_id}.'")]
    assert len(children) == 1
    # a sub-agent is part of its parent's task: a tenant filter lists goals only
    assert children[0].typed_search_attributes.get(tn.TENANT) is None
    assert children[0].typed_search_attributes.get(tn.AGENT) == "tp_helper"


def _spawn(cmd: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


async def test_worker_command_imports_from_the_current_directory(
    tp_client: Client, temporal_env: Any, recorder: Recorder, tmp_path: Path
) -> None:
    mod = f"cwd_agents_{uuid.uuid4().hex[:6]}"
    (tmp_path / f"{mod}.py").write_text(
        "from taskplane import agent, llm\n\n"
        f"@agent(name='{mod}', tenant='acme')\n"
        "async def hello(name: str) -> str:\n"
        "    r = await llm.chat(model='llama-3.1-8b', messages=[{'role': 'user', 'content': name}], max_tokens=4)\n"
        "    return 'hello ' + name\n")
    queue = f"cwd-{uuid.uuid4().hex[:6]}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TASKPLANE_TEMPORAL_ADDRESS=temporal_env.client.service_client.config.target_host,
               TASKPLANE_GATEWAY_URL=recorder.url, TASKPLANE_DATABASE_URL="")
    log = tmp_path / "worker.log"
    proc = _spawn([sys.executable, "-m", "taskplane.cli", "worker", "-m", mod, "--task-queue", queue,
                   "--state-dir", str(tmp_path / "state")], cwd=tmp_path, env=env, log=log)
    try:
        for _ in range(300):
            if "worker_started" in log.read_text(errors="replace") or proc.poll() is not None:
                break
            await asyncio.sleep(0.1)
        assert "worker_started" in log.read_text(errors="replace"), log.read_text()[-2000:]
        sys.path.insert(0, str(tmp_path))
        try:
            module = __import__(mod)
        finally:
            sys.path.remove(str(tmp_path))
        handle = await taskplane.submit(module.hello, "ada", client=tp_client, task_queue=queue)
        assert await asyncio.wait_for(handle.result(), timeout=60) == "hello ada"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def test_run_prints_a_dataclass_result_as_json_and_one_line_per_step_retry(
    temporal_env: Any, recorder: Recorder, tmp_path: Path
) -> None:
    import json

    env = {**os.environ, "TASKPLANE_TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
           "TASKPLANE_GATEWAY_URL": recorder.url, "TASKPLANE_DATABASE_URL": "", "TASKPLANE_STATE_DIR": str(tmp_path)}
    here = Path(__file__).parent
    done = subprocess.run([sys.executable, "-m", "taskplane.cli", "run", "tp_sdk_devloop:flaky_summary",
                           "--arg", "three little words"], env=env, cwd=here, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.endswith("}\n")
    result = json.loads(done.stdout)
    assert result["words"] == 3 and isinstance(result["title"], str)  # a dataclass, as JSON
    assert "step flaky_once attempt 1 failed: RuntimeError: transient failure" in done.stderr
    assert "Traceback" not in done.stderr
