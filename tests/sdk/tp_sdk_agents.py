"""Agents the SDK tests run on a real Temporal dev server. No import-time side effects."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import datetime, timedelta
from pathlib import Path

from pydantic import BaseModel

from taskplane import agent, llm, step
from taskplane.sdk import (
    approval,
    continue_as_new,
    current_context,
    should_continue_as_new,
)

MODEL = "llama-3.1-8b"


def _msg(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@step(retries=1)
async def capture_context(label: str) -> dict[str, object]:
    """A tool that reports the context it received (through the Temporal header)."""
    ctx = current_context()
    return {"label": label, "context": None if ctx is None else ctx.model_dump(mode="json")}


@agent(name="tp_helper", tenant="other-tenant", priority="batch")
async def helper(topic: str) -> str:
    """A sub-agent: its defaults must be overridden by what it inherits from the parent."""
    a = await llm.chat(model=MODEL, messages=_msg(f"sub {topic} 1"), max_tokens=4)
    b = await llm.chat(model=MODEL, messages=_msg(f"sub {topic} 2"), max_tokens=4)
    return a.text + " / " + b.text


@agent(name="tp_context", tenant="acme", priority="interactive", deadline=timedelta(seconds=90), steps=3)
async def context_agent(question: str) -> dict[str, object]:
    replies = []
    for i in range(3):
        r = await llm.chat(model=MODEL, messages=_msg(f"{question} {i}"), max_tokens=4)
        replies.append({"step": r.step, "cost": r.cost_usd, "replica": r.replica})
    tool = await capture_context("after-3")
    sub = await helper("child")
    return {"replies": replies, "tool": tool, "sub": sub}


@agent(name="tp_tool_hint", tenant="acme")
async def tool_hint() -> int:
    """A call, a tool, two calls: only the call right after the tool names it (X-Taskplane-Tool)."""
    await llm.chat(model=MODEL, messages=_msg("hint 0"), max_tokens=4)
    await capture_context("between")
    await llm.chat(model=MODEL, messages=_msg("hint 1"), max_tokens=4)
    await llm.chat(model=MODEL, messages=_msg("hint 2"), max_tokens=4)
    return 3


@agent(name="tp_adapter", tenant="acme", model=MODEL, adapter="tenant-a")
async def adapter_agent() -> int:
    """The agent's model and adapter by default; a call's own adapter or model string wins;
    another model's call runs on that model as it is."""
    await llm.chat(messages=_msg("default"), max_tokens=4)
    await llm.chat(model=MODEL, messages=_msg("same model"), max_tokens=4)
    await llm.chat(model=MODEL, adapter="tenant-b", messages=_msg("own adapter"), max_tokens=4)
    await llm.chat(model=f"{MODEL}:tenant-c", messages=_msg("model string"), max_tokens=4)
    await llm.complete(model="other-model", prompt="another model", max_tokens=4)
    return 5


@agent(name="tp_learner", tenant="acme")
async def learner(n: int) -> int:
    """No author estimate: steps-remaining must come from the agent's history."""
    for i in range(n):
        await llm.chat(model=MODEL, messages=_msg(f"learn {i}"), max_tokens=4)
    return n


@agent(name="tp_simple", tenant="acme")
async def simple(n: int = 1, model: str = MODEL) -> list[str]:
    out = []
    for i in range(n):
        r = await llm.chat(model=model, messages=_msg(f"simple {i}"), max_tokens=4)
        out.append(r.text)
    return out


@agent(name="tp_budget", tenant="acme", max_cost_usd=0.0025)
async def budget_agent(n: int) -> int:
    for i in range(n):
        await llm.chat(model=MODEL, messages=_msg(f"spend {i}"), max_tokens=4)
    return n


@agent(name="tp_sleepy", tenant="acme", deadline=timedelta(seconds=2))
async def sleepy(sleep_s: float) -> str:
    await llm.chat(model=MODEL, messages=_msg("before"), max_tokens=4)
    await asyncio.sleep(sleep_s)  # a durable timer; the deadline passes meanwhile
    await llm.chat(model=MODEL, messages=_msg("after"), max_tokens=4)
    return "unreachable"


@agent(name="tp_sleepy_parent", tenant="acme", deadline=timedelta(seconds=30))
async def sleepy_parent(sleep_s: float) -> str:
    """A parent whose sub-agent runs out of its own (shorter) deadline budget."""
    return await sleepy(sleep_s)


class LoopState(BaseModel):
    done: int = 0
    notes: list[str] = []


@agent(name="tp_looper", tenant="acme", history_limit=30)
async def looper(total: int, state: LoopState | None = None) -> dict[str, object]:
    """A long loop that continues as new whenever its history gets long."""
    state = state or LoopState()
    while state.done < total:
        r = await llm.chat(model=MODEL, messages=_msg(f"loop {state.done}"), max_tokens=4)
        state.notes.append(r.text[:10])
        state.done += 1
        if state.done < total and should_continue_as_new():
            continue_as_new(total, state)
    ctx = current_context()
    assert ctx is not None
    return {"done": state.done, "session": ctx.session_id, "notes": len(state.notes)}


@agent(name="tp_approver", tenant="acme", deadline=timedelta(minutes=5))
async def approver(change: str) -> str:
    plan = await llm.chat(model=MODEL, messages=_msg(f"plan {change}"), max_tokens=4)
    decision = await approval("deploy", details=f"deploy {change}?")
    if not decision.approved:
        return f"rejected: {decision.note}"
    await llm.chat(model=MODEL, messages=_msg(f"deploy {change} {plan.text}"), max_tokens=4)
    return f"deployed: {decision.note}"


@agent(name="tp_clock", tenant="acme")
async def clock_agent() -> str:
    return datetime.now().isoformat()  # not allowed in an agent: must fail with advice


@step(retries=0)
def mark(path: str, label: str) -> int:
    """Appends ``label`` to a file: how the tests count how often a step really ran."""
    with open(path, "a") as f:
        f.write(label + "\n")
    return len(Path(path).read_text().splitlines())


@agent(name="tp_durable", tenant="acme", deadline=timedelta(minutes=5))
async def durable(marks: str, pause_s: float) -> dict[str, object]:
    """Steps and LLM calls around a long durable pause (where the test kills the worker)."""
    costs = []
    for i in range(2):
        r = await llm.chat(model=MODEL, messages=_msg(f"durable {i}"), max_tokens=4)
        costs.append(r.cost_usd)
        await mark(marks, f"before-{i}")
    await mark(marks, "paused")
    await asyncio.sleep(pause_s)
    for i in range(2, 4):
        r = await llm.chat(model=MODEL, messages=_msg(f"durable {i}"), max_tokens=4)
        costs.append(r.cost_usd)
        await mark(marks, f"after-{i}")
    return {"costs": costs}


@step(retries=0)
def env_probe(name: str) -> str:
    return json.dumps({name: os.environ.get(name)})


@agent(name="tp_two_phase", tenant="acme", deadline=timedelta(minutes=2))
async def two_phase() -> list[str | None]:
    """One call, a pause for the test to break that call's replica, then a call that must
    be retried (per-attempt timeout 2 s) and land elsewhere."""
    first = await llm.chat(model=MODEL, messages=_msg("phase one " * 20), max_tokens=4)
    await approval("go")
    second = await llm.chat(model=MODEL, messages=_msg("phase one " * 20 + "phase two"), max_tokens=4,
                            timeout=timedelta(seconds=2))
    return [first.replica, second.replica]


@agent(name="tp_inflight", tenant="acme", deadline=timedelta(minutes=3))
async def inflight(marks: str) -> list[float]:
    """The test kills the worker while the second LLM call is in flight at the gateway."""
    first = await llm.chat(model=MODEL, messages=_msg("inflight 0"), max_tokens=4)
    await mark(marks, "first")
    await approval("go")
    second = await llm.chat(model=MODEL, messages=_msg("inflight 1"), max_tokens=4, timeout=timedelta(seconds=60))
    await mark(marks, "second")
    return [first.cost_usd, second.cost_usd]
