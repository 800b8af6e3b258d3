"""A Pydantic AI agent running as a taskplane task (its durable ``TemporalAgent``).

Plain Pydantic AI code: an ``Agent`` with instructions and a tool, made durable with
``TemporalAgent``. Wrapping its run in ``@agent`` makes it a taskplane task: its model
calls go through the gateway with the task's context (as LLM steps of the task), its
tool runs as an activity, and the task gets its row, status, search attributes, budget
guard and report line.

    taskplane run examples.pydantic_ai_weather:pa_weather_task --arg "Weather in Rome?"
"""

from __future__ import annotations

from datetime import timedelta

from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import TemporalAgent

from taskplane import agent
from taskplane.integrations.pydantic_ai import gateway_model


def get_weather(city: str) -> str:
    """Current weather of a city."""
    return f"{city}: 21 C, clear"  # a real tool would call a weather API here


weather_assistant = TemporalAgent(Agent(
    gateway_model("llama-3.1-8b"),
    name="pa_weather_assistant",
    instructions="Answer weather questions; look the weather up with the tool first.",
    tools=[get_weather],
))


@agent(name="pa-weather", tenant="acme", deadline=timedelta(minutes=2), max_cost_usd=0.05)
async def pa_weather_task(question: str) -> str:
    result = await weather_assistant.run(question)
    return str(result.output)
