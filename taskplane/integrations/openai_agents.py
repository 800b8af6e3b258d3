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

import pydantic
from agents import ModelProvider, OpenAIChatCompletionsModel, set_tracing_disabled
from agents.models.interface import Model
from openai import AsyncOpenAI
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import CompositePayloadConverter, DataConverter, EncodingPayloadConverter
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


_FRAMEWORK_PACKAGES = frozenset({"openai", "agents", "temporalio"})


def _from_framework(cls: type) -> bool:
    return cls.__module__.split(".", 1)[0] in _FRAMEWORK_PACKAGES


def _holds_user_model(value: Any, depth: int = 0) -> bool:
    """True if ``value`` is, or holds (in dicts, lists, tuples, sets), a pydantic model
    defined outside the OpenAI Agents framework."""
    if isinstance(value, pydantic.BaseModel):
        return not _from_framework(type(value))
    if depth >= 8:
        return False
    if isinstance(value, dict):
        return any(_holds_user_model(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_holds_user_model(v, depth + 1) for v in value)
    return False


class _ScopedJSONConverter(PydanticJSONPlainPayloadConverter):
    """The plugin's JSON rules for the plugin's own values, taskplane's for everything else.

    The plugin writes models with ``exclude_unset`` (its model inputs and outputs stay as the
    OpenAI API sent them) and falls back to lenient construction when they fail validation.
    Applied to every workflow of a worker, that silently drops a user model's fields that were
    defaulted and then mutated in place (``state.notes.append(...)`` leaves ``notes`` "unset"):
    an agent's state carried through ``continue_as_new`` lost them. User models are written
    whole and validated strictly."""

    def __init__(self, plugin_json: EncodingPayloadConverter) -> None:
        super().__init__()
        self._plugin_json = plugin_json

    def to_payload(self, value: Any) -> Payload | None:
        if _holds_user_model(value):
            return super().to_payload(value)
        return self._plugin_json.to_payload(value)

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        if isinstance(type_hint, type) and not _from_framework(type_hint):
            return super().from_payload(payload, type_hint)
        return self._plugin_json.from_payload(payload, type_hint)


class TaskplanePayloadConverter(OpenAIPayloadConverter):
    """The plugin's payload converter (it requires its type) with the JSON rules scoped."""

    def __init__(self) -> None:
        plugin = OpenAIPayloadConverter()
        CompositePayloadConverter.__init__(self, *(
            _ScopedJSONConverter(c) if c.encoding == "json/plain" else c for c in plugin.converters.values()))


def worker_data_converter() -> DataConverter:
    """taskplane's converter (pydantic JSON, claim checks) with a payload converter of the
    type the plugin requires; it reads and writes the same JSON as taskplane's clients."""
    return dataclasses.replace(data_converter(), payload_converter_class=TaskplanePayloadConverter)


def step_tool(s: Step, *, timeout: timedelta | None = None) -> Any:
    """A taskplane ``@step`` as an OpenAI Agents tool: it runs as the step's activity (durable, retried)."""
    return oa_workflow.activity_as_tool(s.activity, start_to_close_timeout=timeout or s.timeout,
                                        retry_policy=retry.step_retry_policy(s.retries, s.non_retryable))
