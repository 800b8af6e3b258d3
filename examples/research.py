"""A research agent: plan the questions, search, read, summarise.

One task = one user question. The agent asks the model for a plan (search queries),
runs the ``search`` tool for each, asks the model for notes on each result set, and
asks once more for the summary. Every LLM call carries the task's context, so the
gateway keeps the conversation on a KV-warm replica and knows how many steps are left.

    taskplane run examples.research:research_agent --arg "How does KV-cache-aware routing cut cost?"
"""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

from pydantic import BaseModel

from examples.common import DEFAULT_MODEL, lines
from taskplane import agent, llm, step

#: The search tool's offline corpus (the examples run with no internet).
CORPUS: dict[str, str] = {
    "kv-cache": "The KV cache holds attention keys and values of the tokens already processed; "
                "reusing it skips prefill, the most expensive part of a long prompt.",
    "prefix-routing": "Prefix-aware routing sends a request to the replica that already holds the "
                      "longest matching prefix of its prompt, raising cache hits and cutting time to first token.",
    "continuous-batching": "Continuous batching adds and removes sequences from the running batch at every "
                           "decode step, keeping the GPU busy while requests come and go.",
    "admission": "Admission control sheds or delays work whose deadline cannot be met, so the work that "
                 "can still succeed gets the capacity; shed calls get HTTP 429 with Retry-After.",
    "gpu-generations": "H100, H200 and B200 differ in memory bandwidth and price; decode is bandwidth bound, "
                       "so the cheapest GPU per successful task depends on the mix of prefill and decode.",
    "temporal": "Temporal records every step of a workflow in its history; a worker that dies is replaced "
                "and the workflow resumes where it stopped without repeating completed activities.",
    "agents": "An agent task makes many LLM calls with a growing context, separated by tool calls; "
              "the gaps between calls decide whether its KV cache is still warm when the next call comes.",
    "cost-per-task": "Cost per successful task divides all spend, failed tasks and retries included, by the "
                     "tasks that succeeded within their deadline: the number a business pays for.",
}

_WORD = re.compile(r"[a-z0-9]+")


class Source(BaseModel):
    id: str
    text: str
    score: float


class Report(BaseModel):
    question: str
    queries: list[str]
    notes: list[str]
    summary: str
    sources: list[str]


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) > 2}


@step(retries=2, timeout=timedelta(seconds=10))
async def search(query: str, k: int = 2) -> list[Source]:
    """Keyword search over the offline corpus (a stand-in for a web search API)."""
    await asyncio.sleep(0.05)  # a search API's latency: the tool gap between LLM calls
    q = _words(query)
    scored = [
        Source(id=doc_id, text=text, score=len(q & _words(text + " " + doc_id)) / (len(q) or 1))
        for doc_id, text in CORPUS.items()
    ]
    scored.sort(key=lambda s: (-s.score, s.id))
    return scored[:k]


@agent(name="research", tenant="acme", priority="interactive", deadline=timedelta(minutes=2), steps=5)
async def research_agent(question: str, model: str = DEFAULT_MODEL) -> Report:
    """Answer ``question`` from searched sources: plan, search, read, summarise."""
    system = {"role": "system", "content": "You are a careful research assistant. Cite sources by id."}
    plan = await llm.chat(
        model=model,
        messages=[system, {"role": "user", "content": f"Plan three search queries for: {question}"}],
        max_tokens=48, temperature=0,
    )
    # A model's plan is free text; fall back to the question itself for the missing queries.
    queries = [*lines(plan.text, 3), question, f"{question} cost", f"{question} latency"][:3]

    notes: list[str] = []
    sources: list[str] = []
    history = [system, {"role": "user", "content": question}, plan.message]
    for query in queries:
        found = await search(f"{question} {query}")
        sources += [s.id for s in found if s.id not in sources]
        context = "\n".join(f"[{s.id}] {s.text}" for s in found)
        history.append({"role": "user", "content": f"Notes on these sources for '{query}':\n{context}"})
        note = await llm.chat(model=model, messages=history, max_tokens=40, temperature=0)
        history.append(note.message)
        notes.append(note.text)

    history.append({"role": "user", "content": "Summarise the answer in three sentences."})
    summary = await llm.chat(model=model, messages=history, max_tokens=64, temperature=0)
    return Report(question=question, queries=queries, notes=notes, summary=summary.text, sources=sources)
