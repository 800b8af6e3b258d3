"""Tool calls and structured output through the SDK, on the real stack: Temporal dev
server, the gateway, simulated replicas that honour tools / tool_choice / response_format."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
import tp_sdk_tools as tools_mod
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from tp_sdk_workers import serving_worker

import taskplane
from taskplane.dev.local import LocalCluster
from taskplane.sdk.tools import tool_schema
from workflows.worker import TaskplaneWorker


@pytest_asyncio.fixture(scope="module")
async def tools_worker(tp_client: Client, gw_cluster: LocalCluster, pg_url: str,
                       tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TaskplaneWorker]:
    async with serving_worker(tp_client, gw_cluster.gateway_url, pg_url, ["tp_sdk_tools"], queue_prefix="sdk-tools",
                              outbox_dir=tmp_path_factory.mktemp("tools-outbox")) as worker:
        yield worker


def test_a_step_becomes_an_openai_tool_from_signature_and_docstring() -> None:
    spec = tool_schema(tools_mod.tp_get_weather)
    fn = spec["function"]
    assert spec["type"] == "function" and fn["name"] == "tp_get_weather"
    assert fn["description"] == "Today's weather of a city."
    params = fn["parameters"]
    assert params["required"] == ["city"] and params["additionalProperties"] is False
    assert params["properties"]["city"] == {"type": "string", "description": "the city's name"}
    assert params["properties"]["days"]["type"] == "integer" and params["properties"]["days"]["default"] == 1


def _two_call_seed(gateway_url: str, question: str) -> int:
    """A seed for which the simulated model asks for two tools at once (parallel calls)."""
    specs = [tool_schema(tools_mod.tp_get_weather), tool_schema(tools_mod.flaky_lookup)]
    for seed in range(64):
        body = {"model": tools_mod.MODEL, "messages": [{"role": "user", "content": question}], "tools": specs,
                "tool_choice": "required", "max_tokens": 64, "seed": seed}
        r = httpx.post(f"{gateway_url}/v1/chat/completions", json=body, timeout=30, trust_env=False)
        r.raise_for_status()
        if len(r.json()["choices"][0]["message"]["tool_calls"]) == 2:
            return seed
    raise AssertionError("no seed gives two tool calls")


async def test_tool_loop_runs_calls_as_parallel_durable_steps_and_parses_output(
    tp_client: Client, tools_worker: TaskplaneWorker, gw_cluster: LocalCluster
) -> None:
    question = f"weather and lookup {uuid.uuid4().hex[:6]}"
    seed = _two_call_seed(gw_cluster.gateway_url, question)
    handle = await taskplane.submit(tools_mod.tool_loop, question, seed, client=tp_client,
                                    task_queue=tools_worker.task_queue, deadline=60)
    out: dict[str, Any] = await handle.result()
    calls = out["calls"]
    assert {c["name"] for c in calls} == {"tp_get_weather", "flaky_lookup"}
    assert all(isinstance(c["arguments"], dict) and c["id"] for c in calls)
    # one tool message per call, in order, answering its call id
    assert [r["tool_call_id"] for r in out["results"]] == [c["id"] for c in calls]
    assert all(r["role"] == "tool" for r in out["results"])
    weather = next(r for r, c in zip(out["results"], calls, strict=True) if c["name"] == "tp_get_weather")
    assert '"sky": "sunny"' in weather["content"]
    assert out["message"]["role"] == "assistant" and len(out["message"]["tool_calls"]) == 2
    tools_mod.Verdict.model_validate(out["final"])
    # the flaky tool failed once and was retried by Temporal (a step like any other)
    key = next(c["arguments"]["key"] for c in calls if c["name"] == "flaky_lookup")
    assert tools_mod.ATTEMPTS[key] == 2
    # both tools were scheduled before either finished: they ran in parallel
    order = []
    async for ev in handle.handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = ev.activity_task_scheduled_event_attributes.activity_type.name
            if name in ("tp_get_weather", "flaky_lookup"):
                order.append(("scheduled", name))
        elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED and order and len(order) < 3:
            order.append(("completed", ""))
    assert [o[0] for o in order[:2]] == ["scheduled", "scheduled"]


async def test_named_tool_choice_and_json_schema(tp_client: Client, tools_worker: TaskplaneWorker) -> None:
    named = await (await taskplane.submit(tools_mod.named_tool, "Oslo", client=tp_client,
                                          task_queue=tools_worker.task_queue)).result()
    assert named["names"] == ["tp_get_weather"] and named["finish"] == "tool_calls"
    assert isinstance(named["args"][0]["city"], str)
    value = await (await taskplane.submit(tools_mod.json_schema_agent, "count", client=tp_client,
                                          task_queue=tools_worker.task_queue)).result()
    assert isinstance(value["answer"], str) and 3 <= value["n"] <= 5


async def test_invalid_structured_output_is_a_catchable_error(tp_client: Client, tools_worker: TaskplaneWorker) -> None:
    out = await (await taskplane.submit(tools_mod.bad_output, "cut me", client=tp_client,
                                        task_queue=tools_worker.task_queue)).result()
    assert out["caught"] == "ValidationError"
    assert out["structured"] == "StructuredOutputError" and len(out["raw"]) == 8
