"""Context headers arrive at a real HTTP endpoint with the right values at every step,
in tools and in sub-agents (tasks run on the real Temporal dev server)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import tp_sdk_agents as agents
from temporalio.client import Client
from tp_sdk_recorder import Recorder

import taskplane
from taskplane import temporal_names as tn
from taskplane.context import parse_headers
from workflows.worker import TaskplaneWorker


async def test_headers_at_every_step_and_in_sub_agents(tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder) -> None:
    rec.cost_per_call = 0.001
    started = datetime.now().astimezone()
    handle = await taskplane.submit(
        agents.context_agent, "why", client=tp_client, task_queue=rec_worker.task_queue,
        deadline=timedelta(seconds=60),
    )
    out = await handle.result()
    task_id = handle.task_id

    parent_calls = rec.for_task(task_id)
    assert [c.headers["x-taskplane-step"] for c in parent_calls] == ["0", "1", "2"]
    ctxs = [parse_headers(c.headers) for c in parent_calls]
    for i, ctx in enumerate(ctxs):
        assert ctx.tenant == "acme"
        assert ctx.priority.value == "interactive"
        assert ctx.task_id == task_id
        assert ctx.session_id == task_id
        assert ctx.agent == "tp_context"
        assert ctx.attempt == 1
        assert ctx.call_id == f"{task_id}:{i}"
        assert ctx.steps_remaining == 3 - i - 1  # the author's estimate (steps=3), counting down
        assert ctx.sunk_cost_usd == round(0.001 * i, 8)  # the spend of the calls before this one
        assert ctx.budget_ms is not None and 0 < ctx.budget_ms <= 60_000
    budgets = [c.budget_ms for c in ctxs]
    assert budgets == sorted(budgets, reverse=True)
    # the budget is measured against the submitted deadline (60 s), not the agent's default (90 s)
    assert budgets[0] <= (started + timedelta(seconds=60) - datetime.now().astimezone()).total_seconds() * 1000 + 5_000

    # the tool step saw the task's context through the Temporal header
    tool_ctx = out["tool"]["context"]
    assert tool_ctx["task_id"] == task_id and tool_ctx["tenant"] == "acme" and tool_ctx["step"] == 3

    # the sub-agent: its own task and session, the parent's tenant, priority and budget
    child_id = f"{task_id}.tp_helper-0"
    child_calls = rec.for_task(child_id)
    assert len(child_calls) == 2
    for i, call in enumerate(child_calls):
        ctx = parse_headers(call.headers)
        assert ctx.session_id == child_id
        assert ctx.tenant == "acme"  # not the helper's own default "other-tenant"
        assert ctx.priority.value == "interactive"  # not "batch"
        assert ctx.agent == "tp_helper"
        assert ctx.step == i
        assert ctx.budget_ms is not None and ctx.budget_ms <= budgets[-1]
        # sunk cost: the parent's three calls plus the child's own calls so far
        assert abs(ctx.sunk_cost_usd - (0.003 + 0.001 * i)) < 1e-9

    # spend: parent's 3 calls + the sub-agent's 2, visible on the handle and the search attribute
    assert abs(await handle.cost() - 0.005) < 1e-9
    desc = await handle.handle.describe()
    sa = desc.typed_search_attributes
    assert sa.get(tn.TENANT) == "acme" and sa.get(tn.AGENT) == "tp_context"
    assert sa.get(tn.STATUS) == "succeeded" and sa.get(tn.LLM_CALLS) == 5  # the sub-agent's 2 rolled up
    assert sa.get(tn.DEADLINE) is not None
    memo = await desc.memo()
    assert memo["inputs"] == "tp_context('why')" and memo["tenant"] == "acme"


async def test_the_call_after_a_tool_names_it(tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder) -> None:
    handle = await taskplane.submit(agents.tool_hint, client=tp_client, task_queue=rec_worker.task_queue)
    assert await handle.result() == 3
    tools = [c.headers.get("x-taskplane-tool") for c in rec.for_task(handle.task_id)]
    assert tools == [None, "capture_context", None]
    assert [parse_headers(c.headers).tool for c in rec.for_task(handle.task_id)] == tools


async def test_the_adapter_reaches_the_gateway_in_the_model_string(tp_client: Client, rec_worker: TaskplaneWorker,
                                                                   rec: Recorder) -> None:
    handle = await taskplane.submit(agents.adapter_agent, client=tp_client, task_queue=rec_worker.task_queue)
    assert await handle.result() == 5
    models = [c.body["model"] for c in rec.for_task(handle.task_id)]
    m = agents.MODEL
    assert models == [f"{m}:tenant-a", f"{m}:tenant-a", f"{m}:tenant-b", f"{m}:tenant-c", "other-model"]
    assert all("x-taskplane-adapter" not in c.headers for c in rec.for_task(handle.task_id))


async def test_steps_remaining_learned_from_history(tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder) -> None:
    first = await taskplane.submit(agents.learner, 4, client=tp_client, task_queue=rec_worker.task_queue)
    await first.result()
    assert "x-taskplane-steps-remaining" not in rec.for_task(first.task_id)[0].headers  # nothing known yet

    second = await taskplane.submit(agents.learner, 4, client=tp_client, task_queue=rec_worker.task_queue)
    await second.result()
    remaining = [int(c.headers["x-taskplane-steps-remaining"]) for c in rec.for_task(second.task_id)]
    assert remaining == [3, 2, 1, 0]


async def test_submit_overrides_and_query(tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder) -> None:
    handle = await taskplane.submit(
        agents.simple, 2, client=tp_client, task_queue=rec_worker.task_queue,
        tenant="globex", priority="batch", session_id="shared-session", task_id="sdk-override-1",
    )
    assert await handle.result() == ["reply to step 0", "reply to step 1"]
    calls = rec.for_task("sdk-override-1")
    seen: list[dict[str, Any]] = [parse_headers(c.headers).model_dump() for c in calls]
    assert {s["tenant"] for s in seen} == {"globex"}
    assert {s["priority"] for s in seen} == {"batch"}
    assert {s["session_id"] for s in seen} == {"shared-session"}
    assert all(s["budget_ms"] is None for s in seen)  # no deadline: no budget header
    state = await handle.state()
    assert state.status == "succeeded" and state.llm_calls == 2 and state.session_id == "shared-session"
