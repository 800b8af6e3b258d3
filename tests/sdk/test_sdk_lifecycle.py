"""Long loops (continue-as-new), human in the loop, cancellation and large payloads, on
the real Temporal dev server."""

from __future__ import annotations

import pytest
import tp_sdk_agents as agents
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from tp_sdk_db import wait_status
from tp_sdk_recorder import Recorder

import taskplane
from taskplane.context import parse_headers
from taskplane.sdk import TaskFailed
from taskplane.sdk.payloads import BLOB_ENCODING
from workflows.worker import TaskplaneWorker


async def test_continue_as_new_keeps_session_steps_and_spend(
    tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder
) -> None:
    rec.cost_per_call = 0.001
    total = 12
    handle = await taskplane.submit(agents.looper, total, client=tp_client, task_queue=rec_worker.task_queue,
                                    deadline=120)
    out = await handle.result()
    assert out == {"done": total, "session": handle.task_id, "notes": total}

    calls = rec.for_task(handle.task_id)
    ctxs = [parse_headers(c.headers) for c in calls]
    assert [c.step for c in ctxs] == list(range(total))  # the step index carried across runs
    assert {c.session_id for c in ctxs} == {handle.task_id}
    assert [round(c.sunk_cost_usd, 6) for c in ctxs] == [round(0.001 * i, 6) for i in range(total)]
    budgets = [c.budget_ms or 0 for c in ctxs]
    assert budgets == sorted(budgets, reverse=True)  # the same deadline in every run

    # it really did continue as new (several runs), and the spend survived every one
    runs = 0
    async for _wf in tp_client.list_workflows(f"WorkflowId = '{handle.task_id}'"):
        runs += 1
    assert runs >= 3
    assert await handle.cost() == pytest.approx(0.001 * total)
    state = await handle.state()
    assert state.llm_calls == total and state.run == runs - 1


async def test_approval_update_and_state_query(tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder) -> None:
    handle = await taskplane.submit(agents.approver, "v2", client=tp_client, task_queue=rec_worker.task_queue)
    await wait_status(handle, "waiting-approval")
    state = await handle.state()
    assert state.pending_approvals == ["deploy"] and state.llm_calls == 1
    assert "deploy" in state.current and state.cost_usd > 0
    assert await handle.status() == "waiting-approval"  # the search attribute operators filter on

    after = await handle.approve("deploy", note="ship it", by="alice")
    assert after.decisions[0].approved and after.decisions[0].by == "alice"
    assert await handle.result() == "deployed: ship it"
    assert len(rec.for_task(handle.task_id)) == 2


async def test_rejection_by_signal(tp_client: Client, rec_worker: TaskplaneWorker) -> None:
    handle = await taskplane.submit(agents.approver, "v3", client=tp_client, task_queue=rec_worker.task_queue)
    await wait_status(handle, "waiting-approval")
    await handle.handle.signal("decision", taskplane.sdk.Decision(key="deploy", approved=False, note="not today"))
    assert await handle.result() == "rejected: not today"


async def test_cancel_records_cancelled(tp_client: Client, rec_worker: TaskplaneWorker) -> None:
    handle = await taskplane.submit(agents.approver, "v4", client=tp_client, task_queue=rec_worker.task_queue)
    await wait_status(handle, "waiting-approval")
    await handle.cancel()
    with pytest.raises(TaskFailed) as info:
        await handle.result()
    assert info.value.status == "cancelled"
    assert await handle.status() == "cancelled"


async def test_large_messages_stay_out_of_history(
    tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder
) -> None:
    big = "x" * 300_000  # above the claim-check threshold (128 KiB)
    handle = await taskplane.submit(agents.simple, 1, "m-" + big[:10], client=tp_client,
                                    task_queue=rec_worker.task_queue)
    await handle.result()
    handle2 = await taskplane.submit(agents.context_agent, big, client=tp_client, task_queue=rec_worker.task_queue)
    out = await handle2.result()
    assert out["sub"]
    calls = rec.for_task(handle2.task_id)
    assert calls[0].body["messages"][0]["content"].startswith(big)  # the gateway got the full text

    history = await handle2.handle.fetch_history()
    referenced = 0
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            for p in event.activity_task_scheduled_event_attributes.input.payloads:
                assert p.ByteSize() < 130_000
                referenced += p.metadata.get("encoding") == BLOB_ENCODING
    assert referenced >= 3  # each big LLM request is a reference in the history
    assert sum(e.ByteSize() for e in history.events) < 300_000
