"""Agent tasks through the real gateway and simulated replicas, with attempt rows and
task rows in the real Postgres (the dev server runs the workflows)."""

from __future__ import annotations

import httpx
import pytest
import tp_sdk_agents as agents
from temporalio.client import Client
from tp_sdk_db import calls as _calls
from tp_sdk_db import rows as _rows
from tp_sdk_db import wait_status

import taskplane
from taskplane.dev.local import LocalCluster
from taskplane.reports.compute import build_report
from taskplane.store.records import AttemptRecord, TaskRecord
from workflows.worker import TaskplaneWorker


async def test_task_through_the_gateway_records_context_and_cost(
    tp_client: Client, gw_worker: TaskplaneWorker, pg_url: str
) -> None:
    handle = await taskplane.submit(agents.context_agent, "through the gateway", client=tp_client,
                                    task_queue=gw_worker.task_queue, deadline=60)
    out = await handle.result()
    assert all(r["replica"] for r in out["replies"])
    task_id = handle.task_id
    child_id = f"{task_id}.tp_helper-0"

    rows = await _calls(pg_url, task_id, 3)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["session_id"] == task_id and r["tenant"] == "acme" and r["agent"] == "tp_context"
        assert r["outcome"] == "success" and r["cost_usd"] > 0
    child_rows = await _calls(pg_url, child_id, 2)
    assert [r["step"] for r in child_rows] == [0, 1]
    assert {r["session_id"] for r in child_rows} == {child_id} and {r["tenant"] for r in child_rows} == {"acme"}

    # the goal's row carries every attempt of the tree; the sub-agent's row names its goal
    tasks = await _rows(pg_url, "SELECT * FROM tasks WHERE task_id LIKE :p ORDER BY task_id", p=f"{task_id}%")
    assert [t["task_id"] for t in tasks] == [task_id, child_id]
    task, child = tasks
    assert task["status"] == "succeeded" and task["deadline_met"] is True and task["tenant"] == "acme"
    assert task["finished_at"] is not None and task["deadline"] is not None
    assert task["parent_task_id"] is None and task["root_task_id"] is None
    assert child["parent_task_id"] == task_id and child["root_task_id"] == task_id
    assert child["agent"] == "tp_helper" and child["tenant"] == "acme" and child["status"] == "succeeded"
    total = sum(float(r["cost_usd"]) for r in rows + child_rows)  # type: ignore[arg-type]
    assert task["cost_usd"] == pytest.approx(total, rel=1e-6)
    assert task["attempts"] == 5
    assert child["cost_usd"] == pytest.approx(sum(float(r["cost_usd"]) for r in child_rows), rel=1e-6)  # type: ignore[arg-type]
    assert await handle.cost() == pytest.approx(total, rel=1e-6)

    # the report over these rows: one task (the goal) whose agent carries the whole tree, or two
    # tasks, each agent with its own calls, when sub-agents are counted
    calls = [AttemptRecord.model_validate(r) for r in rows + child_rows]
    records = [TaskRecord.model_validate(t) for t in tasks]
    goals = build_report(calls, records)
    assert (goals.tasks_total, goals.tasks_succeeded, goals.sub_agent_tasks) == (1, 1, 1)
    by_agent = {g.key: g for g in goals.groups_by["agent"]}
    assert set(by_agent) == {"tp_context"} and by_agent["tp_context"].calls == 5
    assert by_agent["tp_context"].cost_per_successful_task_usd == pytest.approx(total, rel=1e-6)
    each = build_report(calls, records, count_sub_agents=True)
    assert (each.tasks_total, each.tasks_succeeded) == (2, 2)
    by_agent = {g.key: g for g in each.groups_by["agent"]}
    assert {k: g.calls for k, g in by_agent.items()} == {"tp_context": 3, "tp_helper": 2}


async def _run_two_phase_with_hung_replica(
    tp_client: Client, worker: TaskplaneWorker, cluster: LocalCluster, pg_url: str
) -> tuple[str, list[str | None], list[dict[str, object]]]:
    """Step 0 runs; the test stalls the replica that served it (its calls hang, its /health
    answers, so the gateway keeps it); step 1 (same session, so affinity sends it there) must
    be retried by Temporal and served elsewhere."""
    handle = await taskplane.submit(agents.two_phase, client=tp_client, task_queue=worker.task_queue)
    await wait_status(handle, "waiting-approval")
    first = (await _calls(pg_url, handle.task_id, 1))[0]
    hung = next(r for r in cluster.replicas if r.name == first["replica"])
    async with httpx.AsyncClient(trust_env=False) as http:
        (await http.post(f"{hung.url}/admin/faults", json={"stall": True})).raise_for_status()
        try:
            await handle.approve("go")
            replicas = await handle.result()
        finally:
            await http.post(f"{hung.url}/admin/faults", json={"clear": True}, timeout=5)
    assert replicas[0] == hung.name
    # Wait for the row of the attempt the client gave up on (recorded once the gateway abandons
    # the hung replica): that abandonment marks the replica failed, and it must not land in the
    # next test, whose step 1 would then not be sent to its hung replica at all.
    rows = [r for r in await _calls(pg_url, handle.task_id, 3, timeout=60) if r["step"] == 1]
    return hung.name, replicas, rows


async def test_retry_after_a_hung_replica_is_served_by_another_replica(
    tp_client: Client, gw_worker: TaskplaneWorker, gw_cluster: LocalCluster, pg_url: str
) -> None:
    hung, replicas, rows = await _run_two_phase_with_hung_replica(tp_client, gw_worker, gw_cluster, pg_url)
    assert replicas[1] != hung
    # the answer the task used came from a Temporal activity retry on another replica
    # (an abandoned attempt on the hung replica may still finish and be recorded: it cost GPU time)
    won = [r for r in rows if r["outcome"] == "success" and r["replica"] == replicas[1]]
    assert won and max(int(r["attempt"]) for r in won) >= 2  # type: ignore[call-overload]


async def test_first_retry_avoids_the_previous_attempts_replica(
    tp_client: Client, gw_worker: TaskplaneWorker, gw_cluster: LocalCluster, pg_url: str
) -> None:
    hung, _, rows = await _run_two_phase_with_hung_replica(tp_client, gw_worker, gw_cluster, pg_url)
    first = [r for r in rows if int(r["attempt"]) == 1]  # type: ignore[call-overload]
    second = [r for r in rows if int(r["attempt"]) == 2]  # type: ignore[call-overload]
    assert any(r["replica"] == hung and r["outcome"] != "success" for r in first), rows
    # the retry never goes back to the replica the previous attempt was stuck on
    assert second and all(r["replica"] != hung for r in second), second
    assert any(r["outcome"] == "success" for r in second)
