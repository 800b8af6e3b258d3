"""Existing agent frameworks on taskplane: their own Temporal integrations, taskplane's task.

``openai_agents`` (the OpenAI Agents SDK on ``temporalio.openai_agents``) and
``pydantic_ai`` (Pydantic AI's ``TemporalAgent``). The author writes an ``@agent`` whose
body runs the framework's agent; the framework turns each model call into its own
Temporal activity, and taskplane's interceptor makes that activity an LLM step of the
task: budget checked, step claimed, context headers sent to the gateway, cost and
attempts counted. So the task gets its row, status, search attributes, budget guard and
report line like any ``@agent`` task. Importing an adapter needs its framework's package.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


@dataclass
class WorkerExtras:
    """What a worker adds for the frameworks its agent modules use."""

    plugins: list[Any] = field(default_factory=list)
    activities: list[Any] = field(default_factory=list)
    data_converter: Any = None
    passthrough: list[str] = field(default_factory=list)


def worker_extras(gateway_url: str | None, modules: Sequence[ModuleType] = ()) -> WorkerExtras:
    """Plugins, twin activities and converter for the frameworks the agent modules imported."""
    extras = WorkerExtras()
    if "agents" not in sys.modules and "pydantic_ai" not in sys.modules:
        return extras
    from taskplane.integrations.gateway_http import set_gateway

    set_gateway(gateway_url)
    if "agents" in sys.modules:  # the OpenAI Agents SDK
        from taskplane.integrations import openai_agents

        extras.plugins.append(openai_agents.plugin(gateway_url))
        extras.activities += openai_agents.activities(gateway_url)
        extras.data_converter = openai_agents.worker_data_converter()
    if "pydantic_ai" in sys.modules:  # Pydantic AI's TemporalAgent
        from taskplane.integrations import pydantic_ai

        plugins, activities = pydantic_ai.worker_parts(modules)
        if activities:
            extras.plugins += plugins
            extras.activities += activities
    return extras
