"""Pydantic AI on taskplane, through its durable Temporal agent (``TemporalAgent``).

    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import TemporalAgent
    from taskplane import agent
    from taskplane.integrations.pydantic_ai import gateway_model

    helper = TemporalAgent(Agent(gateway_model(), name="helper", tools=[lookup]))

    @agent(name="pa-helper", tenant="acme", max_cost_usd=0.05)
    async def helper_task(question: str) -> str:
        return (await helper.run(question)).output

A worker that imports such a module registers the TemporalAgent's activities, the
framework's ``PydanticAIPlugin`` and, for each model-request activity, taskplane's twin
that also returns the gateway's charge: each model call is a taskplane LLM step (budget
checked, step claimed, context headers, cost and attempts counted). The model's OpenAI
client sends to the worker's gateway with its own retries off.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from openai import AsyncOpenAI
from pydantic_ai.durable_exec.temporal import PydanticAIPlugin, TemporalAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from temporalio import activity

from taskplane.integrations.gateway_http import (
    PLACEHOLDER_BASE,
    api_key,
    charged_call,
    gateway_http_client,
)
from taskplane.sdk.interceptors import MODEL_CALLS
from taskplane.sdk.llm import with_adapter

DEFAULT_MODEL = "llama-3.1-8b"


def gateway_model(model_name: str = DEFAULT_MODEL, adapter: str | None = None) -> OpenAIChatModel:
    """A chat model served by the taskplane gateway of whichever worker runs the call;
    ``adapter``: a LoRA adapter on it (the model string ``base:adapter``, as the gateway reads it)."""
    client = AsyncOpenAI(base_url=PLACEHOLDER_BASE, api_key=api_key(), max_retries=0,
                         http_client=gateway_http_client())  # type: ignore[arg-type]  # httpx or httpx2
    return OpenAIChatModel(with_adapter(model_name, adapter), provider=OpenAIProvider(openai_client=client))


def temporal_agents(modules: Sequence[ModuleType]) -> list[TemporalAgent[Any, Any]]:
    """The TemporalAgents the agent modules define (module attributes)."""
    found: dict[int, TemporalAgent[Any, Any]] = {}
    for m in modules:
        for value in vars(m).values():
            if isinstance(value, TemporalAgent):
                found[id(value)] = value
    return list(found.values())


def _twin(fn: Any) -> Any:
    """``fn`` (a model-request activity) under taskplane's name, returning the charge too."""
    name = str(activity._Definition.must_from_callable(fn).name)  # the framework's activity name
    twin_name = "taskplane:" + name
    hints = inspect.get_annotations(fn, eval_str=True)

    async def twin(params: Any, deps: Any = None) -> dict[str, Any]:
        return await charged_call(fn, params, deps)

    twin.__annotations__ = {"params": hints["params"], "deps": hints.get("deps", Any), "return": dict[str, Any]}
    MODEL_CALLS[name] = twin_name
    return activity.defn(name=twin_name)(twin)


def worker_parts(modules: Sequence[ModuleType]) -> tuple[list[Any], list[Any]]:
    """The plugin and the activities (framework's and twins) for the modules' TemporalAgents."""
    acts: list[Any] = []
    for ta in temporal_agents(modules):
        acts += ta.temporal_activities
        model = getattr(ta, "_temporal_model", None)
        request = getattr(model, "request_activity", None)
        if request is not None:
            acts.append(_twin(request))
    return [PydanticAIPlugin()], acts

