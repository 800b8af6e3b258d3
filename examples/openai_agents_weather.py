"""An OpenAI Agents SDK agent running as a taskplane task (its own Temporal integration).

The agent is plain OpenAI Agents code: an ``Agent`` with instructions and a tool, run by
``Runner.run``. Wrapping the run in ``@agent`` makes it a taskplane task: its model calls
go through the gateway with the task's context, its tool is a durable ``@step``, and the
task gets its row, status, search attributes, budget guard and report line.

    taskplane run examples.openai_agents_weather:weather_task --arg "Weather in Oslo?"
"""

from __future__ import annotations

from datetime import timedelta

from agents import Agent, Runner

from taskplane import agent, step
from taskplane.integrations.openai_agents import step_tool

MODEL = "llama-3.1-8b"


@step(retries=2)
async def get_weather(city: str) -> str:
    """Current weather of a city."""
    return f"{city}: 18 C, light wind, sunny"  # a real tool would call a weather API here


weather_assistant = Agent(
    name="weather-assistant",
    instructions="Answer weather questions; look the weather up with the tool first.",
    model=MODEL,
    tools=[step_tool(get_weather)],
)


@agent(name="oa-weather", tenant="acme", deadline=timedelta(minutes=2), max_cost_usd=0.05)
async def weather_task(question: str) -> str:
    result = await Runner.run(weather_assistant, question, max_turns=4)
    return str(result.final_output)
