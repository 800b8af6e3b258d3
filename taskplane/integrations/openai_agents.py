"""The OpenAI Agents SDK on taskplane, through its Temporal integration (``temporalio.openai_agents``).

    from agents import Agent, Runner
    from taskplane import agent
    from taskplane.integrations.openai_agents import step_tool

    helper = Agent(name="helper", instructions="...", model="llama-3.1-8b", tools=[step_tool(search)])

    @agent(name="oa-helper", tenant="acme", max_cost_usd=0.05)
    async def helper_task(question: str) -> str:
        return (await Runner.run(helper, question)).final_output

A worker that imports such a module gets :func:`plugin` (the framework's
``OpenAIAgentsPlugin`` with a model provider pointed at the gateway, the OpenAI client's
retries off) automatically. Each model call is the plugin's activity, made a taskplane
LLM step by the SDK's interceptor (see ``taskplane.integrations``). Tracing export is
disabled: nothing leaves for the internet.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from agents import ModelProvider, OpenAIChatCompletionsModel, set_tracing_disabled
from agents.models.interface import Model
from openai import AsyncOpenAI
from temporalio import activity
from temporalio.converter import DataConverter
from temporalio.openai_agents import (
    ModelActivityParameters,
    OpenAIAgentsPlugin,
    OpenAIPayloadConverter,
)
from temporalio.openai_agents import workflow as oa_workflow
from temporalio.openai_agents._invoke_model_activity import ActivityModelInput, ModelActivity

from taskplane.integrations.gateway_http import (
    api_key,
    charged_call,
    gateway_base_url,
    gateway_http_client,
)
from taskplane.sdk import retry
from taskplane.sdk.interceptors import MODEL_CALLS
from taskplane.sdk.payloads import data_converter
from taskplane.sdk.step import Step

TWIN_ACTIVITY = "taskplane_openai_agents_model"
DEFAULT_MODEL = "llama-3.1-8b"
MODEL_TIMEOUT = timedelta(minutes=2)

MODEL_CALLS["invoke_model_activity"] = TWIN_ACTIVITY
set_tracing_disabled(True)  # no trace export to the OpenAI platform


class GatewayModelProvider(ModelProvider):
    """Chat-completions models served by the taskplane gateway (any model name it serves)."""

    def __init__(self, gateway_url: str | None = None, default_model: str = DEFAULT_MODEL) -> None:
        self.default_model = default_model
        self.client = AsyncOpenAI(base_url=gateway_base_url(gateway_url), api_key=api_key(), max_retries=0,
                                  http_client=gateway_http_client())  # type: ignore[arg-type]  # httpx or httpx2: both work

    def get_model(self, model_name: str | None) -> Model:
        return OpenAIChatCompletionsModel(model=model_name or self.default_model, openai_client=self.client)


class TwinModelActivity:
    """The plugin's model activity under taskplane's name, returning the gateway's charge too."""

    def __init__(self, provider: ModelProvider) -> None:
        self.inner = ModelActivity(provider)

    @activity.defn(name=TWIN_ACTIVITY)
    async def invoke(self, input: ActivityModelInput) -> dict[str, Any]:
        return await charged_call(self.inner.invoke_model_activity, input)


def plugin(gateway_url: str | None = None) -> OpenAIAgentsPlugin:
    """The framework's plugin, its models on the gateway and its retries Temporal's (taskplane's policy)."""
    params = ModelActivityParameters(start_to_close_timeout=MODEL_TIMEOUT, retry_policy=retry.LLM_RETRY_POLICY)
    return OpenAIAgentsPlugin(model_params=params, model_provider=GatewayModelProvider(gateway_url))


def activities(gateway_url: str | None = None) -> list[Any]:
    return [TwinModelActivity(GatewayModelProvider(gateway_url)).invoke]


def worker_data_converter() -> DataConverter:
    """taskplane's converter (pydantic JSON, claim checks) with the plugin's payload converter,
    which it requires; it reads and writes the same JSON as taskplane's clients."""
    return dataclasses.replace(data_converter(), payload_converter_class=OpenAIPayloadConverter)


def step_tool(s: Step, *, timeout: timedelta | None = None) -> Any:
    """A taskplane ``@step`` as an OpenAI Agents tool: it runs as the step's activity (durable, retried)."""
    return oa_workflow.activity_as_tool(s.activity, start_to_close_timeout=timeout or s.timeout,
                                        retry_policy=retry.step_retry_policy(s.retries, s.non_retryable))
