"""Drive the agents-vllm workload against one router over HTTP, as agents would.

Each task runs closed loop on its own coroutine: it arrives at its arrival time, sends
call 0, waits for the whole streamed reply, waits its tool gap, sends call 1 (the context
so far plus the tool's result), and so on. TTFT is measured here, at the client, from the
moment a call is first sent (a 429 and its Retry-After wait included) to the first
streamed chunk that carries text.

Every router gets the same requests; only the routing headers differ: taskplane's
gateway gets the taskplane headers (task, session, step, steps left, tenant, priority,
budget left), a peer router gets ``X-Session-ID`` (what vllm-router's consistent_hash and
kv_aware session affinity key on). An agent gives up on a task once its deadline has
passed, whichever router serves it, so no router is charged for work nobody waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import httpx

from taskplane.bench.real_workload import RealCall, RealTask, RealWorkload
from taskplane.sim.cluster import TaskResult
from taskplane.store.records import TaskStatus

HeaderStyle = Literal["taskplane", "session", "plain"]

#: how long one call may take before it counts as failed
CALL_TIMEOUT_S = 300.0
#: most 429 retries of one call before it counts as shed
MAX_SHED_RETRIES = 20
#: the random-weight model may only sample printable ASCII (vLLM's ``allowed_token_ids``;
#: token id == byte): every generated token is then one visible character, so the first
#: streamed chunk with text is the first token, and no reply carries broken UTF-8
PRINTABLE_ASCII: list[int] = list(range(32, 127))


@dataclass(slots=True)
class CallResult:
    task_id: str
    step: int
    tenant: str
    priority: str
    sent_s: float  # first send, seconds since the run started
    ok: bool = False
    status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    attempts: int = 0
    sheds: int = 0  # 429 answers (the gateway's admission control)
    shed_reasons: list[str] = field(default_factory=list)
    queue_ms: float | None = None  # X-Taskplane-Queue-Ms: time held by the gateway's admission control
    replica: str | None = None  # X-Taskplane-Replica when the router says
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens when reported


@dataclass(slots=True)
class TaskRun:
    """One task as the client drove it: the task, how it ended and every call it sent.

    How it ended is the simulator's :class:`~taskplane.sim.cluster.TaskResult`, so that
    both benches count a task as succeeded (and late, and failed) by one rule
    (:func:`taskplane.bench.metrics.task_figures`). Its ``cost_usd`` stays 0: the real
    bench prices the fleet over the run, not single tasks; ``retries`` stays 0: the client
    never sends a failed call again (a 429's wait-and-resend is a shed, counted per call).
    """

    task: RealTask
    result: TaskResult
    started_s: float | None
    calls: list[CallResult] = field(default_factory=list)

    @property
    def completed(self) -> bool:
        """Every call was answered (late or not)."""
        return self.result.status is TaskStatus.SUCCEEDED

    def as_json(self) -> dict[str, Any]:
        """One line of calls-ROUTER.jsonl (``deadline_s`` is the task's budget, relative)."""
        r = self.result
        return {"task_id": r.task_id, "agent": r.agent, "tenant": r.tenant, "priority": r.priority,
                "arrival_s": r.arrival_s, "deadline_s": self.task.deadline_s, "started_s": self.started_s,
                "finished_s": r.finished_s, "completed": self.completed, "abandoned": not self.completed,
                "status": r.status.value, "deadline_met": r.deadline_met, "error": r.error,
                "calls": [asdict(c) for c in self.calls]}


@dataclass(slots=True)
class Target:
    """Where to send calls: one router URL, or several replica URLs taken in turn
    (client-side round-robin, no router in between)."""

    name: str
    urls: list[str]
    headers: HeaderStyle
    model: str = "tiny-llama"
    _next: int = 0

    def url(self) -> str:
        if len(self.urls) == 1:
            return self.urls[0]
        u = self.urls[self._next % len(self.urls)]
        self._next += 1
        return u


def routing_headers(style: HeaderStyle, task: RealTask, call: RealCall, remaining_s: float | None) -> dict[str, str]:
    """The per-call routing headers of one style (``plain``: none, a bare OpenAI client)."""
    if style == "plain":
        return {}
    if style == "session":
        return {"X-Session-ID": task.task_id}
    h = {
        "X-Taskplane-Tenant": task.tenant,
        "X-Taskplane-Task-Id": task.task_id,
        "X-Taskplane-Session-Id": task.task_id,
        "X-Taskplane-Step": str(call.step),
        "X-Taskplane-Steps-Remaining": str(len(task.calls) - call.step - 1),
        "X-Taskplane-Priority": task.priority,
    }
    if remaining_s is not None:
        h["X-Taskplane-Budget-Ms"] = str(max(0, int(remaining_s * 1000)))
    if call.step > 0 and call.tool:
        h["X-Taskplane-Tool"] = call.tool  # the SDK's "in a tool" hint: the tool that just ran
    return h


async def sse_data(resp: httpx.Response) -> AsyncIterator[str]:
    """The ``data:`` payloads of a server-sent event stream, split on ``\\n`` only.

    Not ``aiter_lines``: it also splits on U+2028, U+0085 and the like, which may sit
    raw inside a JSON string of streamed text.
    """
    buf = ""
    async for text in resp.aiter_text():
        buf += text
        *lines, buf = buf.split("\n")
        for line in lines:
            if line.startswith("data:"):
                yield line[5:].strip()
    if buf.startswith("data:"):
        yield buf[5:].strip()


def _retry_after(resp: httpx.Response) -> float:
    try:
        return max(0.05, float(resp.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0


async def _one_call(
    client: httpx.AsyncClient, target: Target, task: RealTask, call: RealCall, t0: float, arrival_abs: float
) -> CallResult:
    now = time.perf_counter()
    res = CallResult(task_id=task.task_id, step=call.step, tenant=task.tenant, priority=task.priority,
                     sent_s=now - t0)
    body = {"model": target.model, "messages": list(call.messages), "max_tokens": call.max_tokens,
            "temperature": 1.0, "stream": True, "stream_options": {"include_usage": True},
            "allowed_token_ids": PRINTABLE_ASCII}
    start = now
    while True:
        remaining = None
        if task.deadline_s is not None:
            remaining = task.deadline_s - (time.perf_counter() - arrival_abs)
            if remaining <= 0:
                res.error = "deadline passed"
                return res
        res.attempts += 1
        try:
            async with client.stream("POST", f"{target.url()}/v1/chat/completions", json=body,
                                     headers=routing_headers(target.headers, task, call, remaining)) as resp:
                res.status = resp.status_code
                if resp.status_code == 429 and res.sheds < MAX_SHED_RETRIES:
                    res.sheds += 1
                    res.shed_reasons.append((await resp.aread()).decode(errors="replace")[:160])
                    wait = _retry_after(resp)
                    if remaining is not None:
                        wait = min(wait, max(0.0, remaining))
                    await asyncio.sleep(wait)
                    continue
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    res.error = f"HTTP {resp.status_code}: {text[:200]}"
                    return res
                if not await _read_answer(resp, res, start):
                    return res
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            res.error = f"{type(exc).__name__}: {exc}"[:200]
            return res
        res.e2e_s = time.perf_counter() - start
        res.ok = res.ttft_s is not None
        if not res.ok:
            res.error = "no token streamed"
        return res


async def _read_answer(resp: httpx.Response, res: CallResult, start: float) -> bool:
    """Fill ``res`` from a 200 answer: the gateway's headers, the first token's time, the
    usage; False when the stream carried an error instead (``res.error`` says which)."""
    res.replica = resp.headers.get("x-taskplane-replica")
    if "x-taskplane-queue-ms" in resp.headers:
        with contextlib.suppress(ValueError):
            res.queue_ms = float(resp.headers["x-taskplane-queue-ms"])
    async for data in sse_data(resp):
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            res.error = f"stream error: {str(chunk['error'])[:200]}"
            return False
        if res.ttft_s is None:
            choices = chunk.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                res.ttft_s = time.perf_counter() - start
        usage = chunk.get("usage")
        if usage:
            res.prompt_tokens = usage.get("prompt_tokens")
            details = usage.get("prompt_tokens_details") or {}
            res.cached_tokens = details.get("cached_tokens")
    return True


async def _run_task(client: httpx.AsyncClient, target: Target, task: RealTask, t0: float) -> TaskRun:
    arrival_abs = t0 + task.arrival_s
    await asyncio.sleep(max(0.0, arrival_abs - time.perf_counter()))
    started = time.perf_counter() - t0
    calls: list[CallResult] = []
    error: str | None = None
    for call in task.calls:
        if call.gap_s > 0:
            await asyncio.sleep(call.gap_s)
        if task.deadline_s is not None and time.perf_counter() - arrival_abs > task.deadline_s:
            error = "deadline passed"
            break
        res = await _one_call(client, target, task, call, t0, arrival_abs)
        calls.append(res)
        if not res.ok:
            error = res.error or "call failed"
            break
    finished = time.perf_counter() - t0
    return TaskRun(task=task, result=task_outcome(task, calls, error, finished), started_s=started, calls=calls)


def task_outcome(task: RealTask, calls: list[CallResult], error: str | None, finished_s: float) -> TaskResult:
    """How the task ended: succeeded when every call was answered (in time or late), failed
    by its deadline when the agent gave up on it, else failed."""
    if error is None:
        status = TaskStatus.SUCCEEDED
        met = task.deadline_s is None or finished_s - task.arrival_s <= task.deadline_s
    else:
        status = TaskStatus.FAILED_DEADLINE if error == "deadline passed" else TaskStatus.FAILED
        met = False
    return TaskResult(
        task_id=task.task_id, agent=task.agent, tenant=task.tenant, priority=task.priority, status=status,
        arrival_s=task.arrival_s, finished_s=finished_s,
        deadline_s=None if task.deadline_s is None else task.arrival_s + task.deadline_s, deadline_met=met,
        cost_usd=0.0, attempts=sum(c.attempts for c in calls), retries=0,
        calls_done=sum(1 for c in calls if c.ok), calls_total=len(task.calls), error=error,
    )


async def drive(
    target: Target, workload: RealWorkload, *, progress: Callable[[int], None] | None = None
) -> tuple[list[TaskRun], float]:
    """Run every task of ``workload`` against ``target``; returns the task results and
    the run's wall time in seconds."""
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=128)
    timeout = httpx.Timeout(CALL_TIMEOUT_S, connect=10.0)
    done = 0
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        t0 = time.perf_counter()

        async def run(task: RealTask) -> TaskRun:
            nonlocal done
            r = await _run_task(client, target, task, t0)
            done += len(r.calls)
            if progress is not None:
                progress(done)
            return r

        results = await asyncio.gather(*(run(t) for t in workload.tasks))
        wall = time.perf_counter() - t0
    return list(results), wall


def run_workload(
    target: Target, workload: RealWorkload, *, progress: Callable[[int], None] | None = None
) -> tuple[list[TaskRun], float]:
    """Synchronous wrapper of :func:`drive`."""
    return asyncio.run(drive(target, workload, progress=progress))
