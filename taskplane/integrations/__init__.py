"""Existing agent frameworks on taskplane: their own Temporal integrations, taskplane's task.

``openai_agents``: the OpenAI Agents SDK on ``temporalio.openai_agents``. (A Pydantic AI
``TemporalAgent`` adapter would plug into the same ``MODEL_CALLS`` hook; not built yet.) The author writes an ``@agent`` whose
body runs the framework's agent; the framework turns each model call into its own
Temporal activity, and taskplane's interceptor makes that activity an LLM step of the
task: budget checked, step claimed, context headers sent to the gateway, cost and
attempts counted. So the task gets its row, status, search attributes, budget guard and
report line like any ``@agent`` task. Importing an adapter needs its framework's package.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WorkerExtras:
    """What a worker adds for the frameworks its agent modules use."""

    plugins: list[Any] = field(default_factory=list)
    activities: list[Any] = field(default_factory=list)
    data_converter: Any = None
    passthrough: list[str] = field(default_factory=list)


def worker_extras(gateway_url: str | None) -> WorkerExtras:
    """Plugins, twin activities and converter for the frameworks already imported (by agent modules)."""
    extras = WorkerExtras()
    if "agents" in sys.modules:  # the OpenAI Agents SDK
        from taskplane.integrations import openai_agents

        extras.plugins.append(openai_agents.plugin(gateway_url))
        extras.activities += openai_agents.activities(gateway_url)
        extras.data_converter = openai_agents.worker_data_converter()
    return extras
