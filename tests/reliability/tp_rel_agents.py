"""The agent the fault matrix runs: a short multi-step session with growing context and a
tool-call gap between steps, so tasks are in flight (mid-call or between calls) when a
fault strikes. No import-time side effects (the worker re-imports it per task)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from taskplane import agent, llm

MODEL = "llama-3.1-8b"
#: One attempt may take this long before Temporal retries it; short, so a killed worker's
#: in-flight calls are retried within seconds rather than the SDK's default two minutes.
ATTEMPT_TIMEOUT = timedelta(seconds=8)


@agent(name="rel_session", tenant="acme", deadline=timedelta(minutes=3))
async def rel_session(steps: int, tag: str, gap_s: float = 0.4) -> dict[str, object]:
    history = [{"role": "system", "content": f"You are a careful agent working on {tag}. " * 8}]
    replicas = []
    for i in range(steps):
        history.append({"role": "user", "content": f"tool result {i} for {tag}: " + "data " * 20})
        r = await llm.chat(model=MODEL, messages=history, max_tokens=24, timeout=ATTEMPT_TIMEOUT)
        replicas.append(r.replica)
        history.append({"role": "assistant", "content": r.text})
        await asyncio.sleep(gap_s)  # the tool runs (a durable timer)
    return {"steps": steps, "replicas": replicas}
