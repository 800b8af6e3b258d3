"""A coding agent loop: propose a patch, run the tests, read the failures, try again.

Many LLM calls with a growing conversation, separated by a test tool that takes a while:
the gap during which the session's KV cache must survive on its replica for the next
call to be cheap. The loop continues as new whenever its history grows long, carrying
its state; the session, step count, spend and deadline carry over on their own.

    taskplane run examples.coding:coding_agent --arg "make test_parser pass"
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import timedelta

from pydantic import BaseModel

from examples.common import DEFAULT_MODEL
from taskplane import agent, llm, step
from taskplane.sdk import continue_as_new, should_continue_as_new

#: Characters of conversation kept: the replica's context window bounds the growing prompt.
MAX_CONTEXT_CHARS = 6000


class TestRun(BaseModel):
    passed: int
    failed: int
    output: str


class CodingState(BaseModel):
    iteration: int = 0
    messages: list[dict[str, str]] = []
    failures: list[int] = []


class CodingResult(BaseModel):
    task: str
    iterations: int
    passed: bool
    failures: list[int]


@step(retries=1, timeout=timedelta(seconds=60))
async def run_tests(task: str, patch: str, iteration: int, gap_s: float = 0.5) -> TestRun:
    """A test runner (simulated: the suite takes ``gap_s`` and fails less after each patch).

    How many tests fail is a pure function of the task and the iteration, so reruns of
    the example give the same story; the pause is the tool gap between two LLM calls.
    """
    await asyncio.sleep(gap_s)
    total = 12
    start = 3 + int(hashlib.sha256(task.encode()).hexdigest(), 16) % 4  # 3..6 failing at first
    failed = max(start - iteration // 2, 0)  # a failure fixed every other patch
    names = [f"test_case_{i}" for i in range(failed)]
    output = "all tests passed" if not failed else "FAILED " + ", ".join(names) + f" (patch {len(patch)} chars)"
    return TestRun(passed=total - failed, failed=failed, output=output)


def _trim(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Keep the system prompt and the task, drop the oldest turns beyond the window."""
    head, tail = messages[:2], messages[2:]
    while tail and sum(len(m["content"]) for m in head + tail) > MAX_CONTEXT_CHARS:
        tail = tail[2:]
    return head + tail


@agent(name="coding", tenant="globex", priority="standard", deadline=timedelta(minutes=5), steps=10,
       history_limit=80)
async def coding_agent(
    task: str,
    max_iterations: int = 16,
    gap_s: float = 0.5,
    model: str = DEFAULT_MODEL,
    state: CodingState | None = None,
) -> CodingResult:
    """Patch until the tests pass (or ``max_iterations``), with ``gap_s`` of test time per round."""
    state = state or CodingState(messages=[
        {"role": "system", "content": "You are a coding agent. Reply with a unified diff only."},
        {"role": "user", "content": f"Task: {task}. The repository's tests are failing."},
    ])
    while state.iteration < max_iterations:
        reply = await llm.chat(model=model, messages=_trim(state.messages), max_tokens=96, temperature=0)
        state.messages.append(reply.message)
        result = await run_tests(task, reply.text, state.iteration, gap_s)
        state.failures.append(result.failed)
        state.iteration += 1
        if result.failed == 0:
            return CodingResult(task=task, iterations=state.iteration, passed=True, failures=state.failures)
        state.messages.append({"role": "user", "content": f"Test output:\n{result.output}\nFix the remaining failures."})
        if should_continue_as_new():
            continue_as_new(task, max_iterations, gap_s, model, state)
    return CodingResult(task=task, iterations=state.iteration, passed=False, failures=state.failures)
