"""Tool-using and structured-output agents for the SDK tests. No import-time side effects."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from taskplane import agent, llm, step
from taskplane.sdk import StructuredOutputError

MODEL = "llama-3.1-8b"
ATTEMPTS: dict[str, int] = {}  # per worker process: how often the flaky tool ran


@step(retries=2)
async def tp_get_weather(city: str, days: int = 1) -> dict[str, Any]:
    """Today's weather of a city.

    Args:
        city: the city's name
        days: how many days of forecast
    """
    return {"city": city, "days": days, "sky": "sunny"}


@step(retries=2)
async def flaky_lookup(key: str) -> str:
    """Look a key up (fails on its first attempt, to show the step retry)."""
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    if ATTEMPTS[key] == 1:
        raise RuntimeError("transient lookup failure")
    return f"value of {key}"


class Verdict(BaseModel):
    title: str = Field(max_length=60)
    score: float = Field(ge=0, le=1)
    tags: list[str]


@agent(name="tp_tool_loop", tenant="acme", steps=3)
async def tool_loop(question: str, seed: int = 0) -> dict[str, Any]:
    """The canonical loop: ask with tools, run what the model asked for, ask again."""
    tools = [tp_get_weather, flaky_lookup]
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    first = await llm.chat(model=MODEL, messages=messages, tools=tools, tool_choice="required", max_tokens=64,
                           seed=seed)
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in first.tool_calls]
    results = await llm.run_tool_calls(first, tools)
    messages += [first.message, *results]
    final = await llm.chat(model=MODEL, messages=messages, tools=tools, response_format=Verdict, max_tokens=400)
    assert isinstance(final.parsed, Verdict)
    return {"calls": calls, "results": results, "final": final.parsed.model_dump(), "message": first.message}


@agent(name="tp_named_tool", tenant="acme")
async def named_tool(city: str) -> dict[str, Any]:
    r = await llm.chat(model=MODEL, messages=[{"role": "user", "content": city}], tools=[tp_get_weather],
                       tool_choice=tp_get_weather, max_tokens=32)
    return {"names": [c.name for c in r.tool_calls], "args": [c.arguments for c in r.tool_calls],
            "finish": r.finish_reason}


SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}, "n": {"type": "integer", "minimum": 3,
          "maximum": 5}}, "required": ["answer", "n"]}


@agent(name="tp_json_schema", tenant="acme")
async def json_schema_agent(q: str) -> dict[str, Any]:
    r = await llm.chat(model=MODEL, messages=[{"role": "user", "content": q}], response_format=SCHEMA)
    return dict(r.parsed)


class Strict(BaseModel):
    must_be_present: int


@agent(name="tp_bad_output", tenant="acme")
async def bad_output(q: str) -> dict[str, Any]:
    """The engine is asked for one schema, the author validates against another: catchable."""
    try:
        await llm.chat(model=MODEL, messages=[{"role": "user", "content": q}],
                       response_format={"type": "json_object"}, max_tokens=200)
        r = await llm.chat(model=MODEL, messages=[{"role": "user", "content": q}], response_format=SCHEMA,
                           max_tokens=400)
        Strict.model_validate(r.parsed)
    except Exception as exc:  # pydantic's own error: the author's check
        caught = type(exc).__name__
    try:
        await llm.chat(model=MODEL, messages=[{"role": "user", "content": q}], max_tokens=8,
                       response_format=Strict, tool_choice="none")
        return {"caught": caught, "structured": None}
    except StructuredOutputError as exc:
        return {"caught": caught, "structured": exc.failure_type, "raw": exc.raw}
