"""A real worker process SIGKILLed mid-task: a new worker resumes the task from Temporal's
history; no step runs twice, no LLM call is sent twice, no cost is counted twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tp_sdk_agents as agents
from temporalio.client import Client
from tp_sdk_db import calls as _calls
from tp_sdk_db import rows as _rows
from tp_sdk_db import wait_status

import taskplane
from taskplane.dev.local import LocalCluster

HERE = Path(__file__).parent


class WorkerProcess:
    """``taskplane worker`` as a child process on its own task queue."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        start = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "taskplane.cli", "worker", "--module", "tp_sdk_agents"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
            )
        for _ in range(300):
            text = self.log.read_bytes()[start:].decode(errors="replace")
            if "worker_started" in text:
                return self
            assert self.proc.poll() is None, f"worker exited: {text[-2000:]}"
            time.sleep(0.1)
        raise AssertionError("worker did not start in 30 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def worker_env(temporal_env: Any, gw_cluster: LocalCluster, pg_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    yield {
        "TASKPLANE_TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
        "TASKPLANE_GATEWAY_URL": gw_cluster.gateway_url,
        "TASKPLANE_DATABASE_URL": pg_url,
        "TASKPLANE_STATE_DIR": str(tmp_path / "state"),
        "TASKPLANE_TASK_QUEUE": f"sdk-kill-{uuid.uuid4().hex[:8]}",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }


async def test_worker_killed_mid_task_resumes_without_repeating_work(
    tp_client: Client, worker_env: dict[str, str], pg_url: str, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    log = tmp_path / "worker.log"
    first = WorkerProcess(worker_env, log).start()
    second: WorkerProcess | None = None
    try:
        handle = await taskplane.submit(agents.durable, str(marks), 6.0, client=tp_client,
                                        task_queue=worker_env["TASKPLANE_TASK_QUEUE"])
        for _ in range(300):
            if marks.exists() and "paused" in marks.read_text():
                break
            await asyncio.sleep(0.1)
        assert "paused" in marks.read_text()
        first.kill()  # SIGKILL: no clean shutdown, no goodbye to Temporal
        assert first.proc is not None and first.proc.returncode == -signal.SIGKILL

        second = WorkerProcess(worker_env, log).start()
        out = await asyncio.wait_for(handle.result(), 90)
    finally:
        first.kill()
        if second is not None:
            second.stop()

    # every step ran exactly once, in order, across the two workers
    assert marks.read_text().splitlines() == ["before-0", "before-1", "paused", "after-2", "after-3"]

    # every LLM call reached the gateway exactly once (one attempt row per call id)
    rows = await _calls(pg_url, handle.task_id, 4)
    assert [(r["step"], r["attempt"]) for r in rows] == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert len({r["attempt_key"] for r in rows}) == 4

    # the cost is counted once: the result, the task row and the rows agree
    total = sum(float(r["cost_usd"]) for r in rows)  # type: ignore[arg-type]
    assert sum(out["costs"]) == pytest.approx(total, rel=1e-3)
    tasks = await _rows(pg_url, "SELECT * FROM tasks WHERE task_id = :t", t=handle.task_id)
    assert len(tasks) == 1 and tasks[0]["status"] == "succeeded"
    assert tasks[0]["cost_usd"] == pytest.approx(total, rel=1e-9)
    assert tasks[0]["retries"] == 0 and tasks[0]["attempts"] == 4
    assert await handle.cost() == pytest.approx(total, rel=1e-9)


async def test_worker_killed_during_an_llm_call_retries_it_once_and_counts_each_attempt_once(
    tp_client: Client, worker_env: dict[str, str], gw_cluster: LocalCluster, pg_url: str, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    log = tmp_path / "worker.log"
    first = WorkerProcess(worker_env, log).start()
    second: WorkerProcess | None = None
    urls = [r.url for r in gw_cluster.replicas]
    async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
        try:
            handle = await taskplane.submit(agents.inflight, str(marks), client=tp_client,
                                            task_queue=worker_env["TASKPLANE_TASK_QUEUE"])
            await wait_status(handle, "waiting-approval")
            for url in urls:  # every replica stops answering: the next call stays in flight
                (await http.post(f"{url}/admin/faults", json={"hang": True})).raise_for_status()
            t_kill = time.monotonic()
            await handle.approve("go")
            await asyncio.sleep(1.5)
            first.kill()  # mid-call: the activity never reports back
            for url in urls:
                await http.post(f"{url}/admin/faults", json={"clear": True})
            second = WorkerProcess(worker_env, log).start()
            costs = await asyncio.wait_for(handle.result(), 120)
            recovered_s = time.monotonic() - t_kill
        finally:
            first.kill()
            if second is not None:
                second.stop()
            for url in urls:
                await http.post(f"{url}/admin/faults", json={"clear": True})

    assert marks.read_text().splitlines() == ["first", "second"]  # no step ran twice
    assert recovered_s < 40  # the heartbeat timeout (10 s) noticed the dead worker, not the 60 s call timeout
    rows = await _calls(pg_url, handle.task_id, 2)
    assert len({r["attempt_key"] for r in rows}) == len(rows)  # each attempt recorded once
    step1 = [r for r in rows if r["step"] == 1]
    used = [r for r in step1 if r["outcome"] == "success" and int(r["attempt"]) >= 2]  # type: ignore[call-overload]
    assert len(used) == 1  # Temporal retried the in-flight call once, as attempt 2
    assert costs[1] == pytest.approx(float(used[0]["cost_usd"]), rel=1e-3)  # type: ignore[arg-type]
    # The task's cost counts every recorded attempt once: at least the calls it used, never
    # more than the distinct rows (the abandoned attempt 1 is in it when the gateway recorded
    # it before the task ended).
    step0 = [r for r in rows if r["step"] == 0 and r["outcome"] == "success"]
    task = (await _rows(pg_url, "SELECT * FROM tasks WHERE task_id = :t", t=handle.task_id))[0]
    assert task["status"] == "succeeded"
    floor = sum(float(r["cost_usd"]) for r in step0 + used)  # type: ignore[arg-type]
    ceiling = sum(float(r["cost_usd"]) for r in rows)  # type: ignore[arg-type]
    assert floor * (1 - 1e-9) <= task["cost_usd"] <= ceiling * (1 + 1e-9)  # type: ignore[operator]
