"""The agent the orchestration-overhead benchmark runs (``benchmarks.orchestration_overhead``).

It makes ``n`` back-to-back LLM calls with nothing in between, so the time from one
call's HTTP response to the next call's HTTP request is pure orchestration: activity
completion, workflow task, next activity scheduled, dispatched and started.
"""

from __future__ import annotations

from taskplane import agent, llm


@agent(name="overhead-probe", tenant="bench", priority="standard")
async def overhead_probe(n: int, model: str = "llama-3.1-8b") -> list[list[float]]:
    """Per call: [HTTP send wall time, HTTP response wall time, HTTP ms]."""
    marks: list[list[float]] = []
    for i in range(n):
        r = await llm.chat(model=model, messages=[{"role": "user", "content": f"probe {i}"}], max_tokens=1)
        marks.append([r.started_at_s, r.ended_at_s, r.http_ms])
    return marks
