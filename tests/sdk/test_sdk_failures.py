"""Retries, fail-fast errors, deadlines, the cost guard and determinism errors, on the
real Temporal dev server against a real HTTP endpoint."""

from __future__ import annotations

import time

import pytest
import tp_sdk_agents as agents
from temporalio.client import Client
from tp_sdk_recorder import Recorder

import taskplane
from taskplane import temporal_names as tn
from taskplane.errors import UserError
from taskplane.sdk import TaskFailed
from workflows.worker import TaskplaneWorker, build_worker


async def _fails(handle: taskplane.TaskHandle) -> TaskFailed:
    with pytest.raises(TaskFailed) as info:
        await handle.result()
    return info.value


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(400, "invalid_request"), (401, "unauthorized"), (403, "forbidden"), (404, "model_not_found")],
)
async def test_non_retryable_error_fails_fast(
    tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder, status: int, error_type: str
) -> None:
    rec.fail_next(status, error_type, times=5)
    t0 = time.monotonic()
    handle = await taskplane.submit(agents.simple, 1, client=tp_client, task_queue=rec_worker.task_queue)
    failure = await _fails(handle)
    assert failure.status == "failed"
    assert failure.failure_type == "LlmError"
    assert error_type in failure.message
    assert len(rec.for_task(handle.task_id)) == 1  # one attempt, no retry
    assert time.monotonic() - t0 < 5
    assert await handle.status() == "failed"


async def test_deadline_unmeetable_fails_fast_as_failed_deadline(
    tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder
) -> None:
    rec.fail_next(504, "deadline_unmeetable", times=5)
    handle = await taskplane.submit(agents.simple, 1, client=tp_client, task_queue=rec_worker.task_queue, deadline=30)
    failure = await _fails(handle)
    assert failure.status == "failed-deadline"
    assert failure.failure_type == "DeadlineExceeded"
    assert len(rec.for_task(handle.task_id)) == 1


async def test_transient_errors_retry_with_attempt_number_and_stable_call_id(
    tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder
) -> None:
    rec.fail_next(503, "no_replica")
    rec.fail_next(502, "replica_error")
    handle = await taskplane.submit(agents.simple, 1, client=tp_client, task_queue=rec_worker.task_queue)
    assert await handle.result() == ["reply to step 0"]
    calls = rec.for_task(handle.task_id)
    assert [c.headers["x-taskplane-attempt"] for c in calls] == ["1", "2", "3"]
    assert {c.headers["x-taskplane-call-id"] for c in calls} == {f"{handle.task_id}:0"}
    assert {c.headers["x-taskplane-step"] for c in calls} == {"0"}
    out = await handle.outcome()
    assert out.llm_calls == 1 and out.attempts == 3


async def test_retry_after_is_the_next_retry_delay(tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder) -> None:
    rec.fail_next(429, "overloaded", headers={"Retry-After": "2"})
    handle = await taskplane.submit(agents.simple, 1, client=tp_client, task_queue=rec_worker.task_queue)
    await handle.result()
    calls = rec.for_task(handle.task_id)
    assert len(calls) == 2
    gap = calls[1].at - calls[0].at
    assert gap >= 1.9  # the policy's own first interval is 0.2 s: Retry-After won


async def test_retry_after_beyond_the_budget_fails_as_deadline(
    tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder
) -> None:
    rec.fail_next(429, "overloaded", headers={"Retry-After": "120"})
    t0 = time.monotonic()
    handle = await taskplane.submit(agents.simple, 1, client=tp_client, task_queue=rec_worker.task_queue, deadline=10)
    failure = await _fails(handle)
    assert failure.status == "failed-deadline"
    assert len(rec.for_task(handle.task_id)) == 1
    assert time.monotonic() - t0 < 8


async def test_budget_that_runs_out_ends_the_task_failed_deadline(
    tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder
) -> None:
    handle = await taskplane.submit(agents.sleepy, 3.0, client=tp_client, task_queue=rec_worker.task_queue)
    failure = await _fails(handle)
    assert failure.status == "failed-deadline"
    assert failure.failure_type == "DeadlineExceeded"
    assert len(rec.for_task(handle.task_id)) == 1  # the call after the deadline was never sent
    assert await handle.status() == "failed-deadline"


async def test_sub_agent_deadline_failure_names_the_child_once(
    tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder
) -> None:
    handle = await taskplane.submit(agents.sleepy_parent, 3.0, client=tp_client, task_queue=rec_worker.task_queue)
    failure = await _fails(handle)
    child_id = f"{handle.task_id}.tp_sleepy-0"
    assert failure.status == "failed-deadline"
    assert failure.failure_type == "DeadlineExceeded"
    assert failure.message.count(child_id) == 1, failure.message
    assert failure.message.count("(spent $") == 1, failure.message  # the parent's spend, said once
    assert len(rec.for_task(child_id)) == 1  # the child's call after its deadline was never sent


async def test_endless_transient_errors_stop_at_the_deadline(
    tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder
) -> None:
    rec.fail_next(503, "no_replica", times=1000)
    t0 = time.monotonic()
    handle = await taskplane.submit(agents.simple, 1, client=tp_client, task_queue=rec_worker.task_queue, deadline=3)
    failure = await _fails(handle)
    rec.reset()
    assert failure.status == "failed-deadline"
    assert time.monotonic() - t0 < 10


async def test_cost_guard_stops_the_task_with_the_spend_recorded(
    tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder
) -> None:
    rec.cost_per_call = 0.001
    handle = await taskplane.submit(agents.budget_agent, 10, client=tp_client, task_queue=rec_worker.task_queue)
    failure = await _fails(handle)
    assert failure.status == "failed"
    assert failure.failure_type == "BudgetExceeded"
    assert "max_cost_usd" in failure.message
    assert len(rec.for_task(handle.task_id)) == 3  # stopped once the spend (0.003) crossed 0.0025
    assert failure.cost_usd == pytest.approx(0.003)
    assert await handle.cost() == pytest.approx(0.003)
    desc = await handle.handle.describe()
    assert desc.typed_search_attributes.get(tn.LLM_CALLS) == 3


async def test_submit_max_cost_overrides_the_agent(tp_client: Client, rec_worker: TaskplaneWorker, rec: Recorder) -> None:
    rec.cost_per_call = 0.001
    handle = await taskplane.submit(agents.budget_agent, 10, client=tp_client, task_queue=rec_worker.task_queue,
                                    max_cost_usd=0.0005)
    failure = await _fails(handle)
    assert failure.failure_type == "BudgetExceeded"
    assert len(rec.for_task(handle.task_id)) == 1


async def test_non_deterministic_agent_fails_with_advice(tp_client: Client, rec_worker: TaskplaneWorker) -> None:
    handle = await taskplane.submit(agents.clock_agent, client=tp_client, task_queue=rec_worker.task_queue)
    failure = await _fails(handle)
    assert failure.failure_type == "AgentNotDeterministic"
    assert "@step" in failure.message and "datetime" in failure.message


async def test_import_time_side_effect_is_refused_with_advice(tp_client: Client) -> None:
    with pytest.raises(UserError) as info:
        await build_worker(tp_client, "http://127.0.0.1:9", None, ["tp_sdk_bad_module"], task_queue="sdk-bad",
                           include_examples=False)
    assert "import" in str(info.value) and "@step" in str(info.value)


async def test_agent_called_outside_a_task_says_what_to_do() -> None:
    with pytest.raises(taskplane.sdk.AgentError, match=r"taskplane.submit"):
        agents.simple(1)
    with pytest.raises(taskplane.sdk.AgentError, match=r"inside an @agent"):
        await taskplane.llm.chat(model="m", messages=[])
