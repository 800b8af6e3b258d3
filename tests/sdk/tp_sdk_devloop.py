"""Agents for the dev-loop tests: deadlines that must preempt, a dataclass result."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from taskplane import agent, llm, step

MODEL = "llama-3.1-8b"


@step(retries=0, timeout=timedelta(seconds=60))
async def slow_tool(seconds: float) -> str:
    """A tool that takes far longer than the task may."""
    await asyncio.sleep(seconds)
    return "done"


@agent(name="tp_sleeper", tenant="acme", deadline=timedelta(seconds=3))
async def sleeper(sleep_s: float) -> str:
    await llm.chat(model=MODEL, messages=[{"role": "user", "content": "before"}], max_tokens=4)
    await asyncio.sleep(sleep_s)  # the deadline must end the task during this sleep
    return "unreachable"


@agent(name="tp_slow_tool", tenant="acme", deadline=timedelta(seconds=3))
async def slow_tool_agent(sleep_s: float) -> str:
    return await slow_tool(sleep_s)


@agent(name="tp_long_tool", tenant="acme")
async def long_tool_agent(sleep_s: float) -> str:
    """No deadline: only a cancel request ends it while its tool runs."""
    return await slow_tool(sleep_s)


@dataclass
class Summary:
    title: str
    words: int


@agent(name="tp_summary", tenant="acme")
async def summary(text: str) -> Summary:
    r = await llm.chat(model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=8)
    return Summary(title=r.text, words=len(text.split()))


RUNS: dict[str, int] = {}


@step(retries=2)
async def flaky_once(key: str) -> str:
    """Fails on its first attempt: the retry must log one line, not a traceback."""
    RUNS[key] = RUNS.get(key, 0) + 1
    if RUNS[key] == 1:
        raise RuntimeError(f"transient failure of {key}")
    return key


@agent(name="tp_flaky_summary", tenant="acme")
async def flaky_summary(text: str) -> Summary:
    await flaky_once(text)
    return await summary_body(text)


async def summary_body(text: str) -> Summary:
    r = await llm.chat(model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=8)
    return Summary(title=r.text, words=len(text.split()))
