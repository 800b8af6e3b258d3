"""The cluster simulator's state of each task and call, and what it makes of a call: the
scheduler's :class:`CallRequest`, the engine's :class:`SimRequest`, the attempt's
:class:`CallRecord`.

A call keeps its identity across attempts; ``key`` (``task:step:attempt``) names the
current attempt: its record key, the scheduler's call id and the engine's request id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from taskplane.scheduler.types import CallRequest
from taskplane.sim.blocks import extend_hashes
from taskplane.sim.hints import HintMode, steps_hint
from taskplane.sim.requests import Finished, SimRequest
from taskplane.sim.results import CallRecord, TaskResult
from taskplane.sim.tokens import RepeatedBlocks
from taskplane.sim.workloads.base import TaskSpec
from taskplane.store.records import Outcome, TaskStatus


@dataclass(slots=True, eq=False)
class TaskState:
    """One task while the simulation runs."""

    spec: TaskSpec
    ctx: int = 0  # context tokens so far (closed loop)
    contents: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    cost: float = 0.0
    attempts: int = 0
    retries: int = 0
    done_calls: int = 0
    failed: str | None = None
    status: TaskStatus | None = None  # None while it runs
    finished_s: float | None = None
    deadline_abs: float | None = None


@dataclass(slots=True, eq=False)
class SimCall:
    """One call of a task, through its attempts."""

    task: TaskState
    step: int
    prompt_tokens: int
    output_tokens: int
    n_prompt_blocks: int
    n_total_blocks: int
    key: str  # "task:step:attempt": the attempt's record key, call id and engine request id
    # the chain hashes / contents of the call's blocks (a closed-loop task's lists only grow,
    # so calls share them; an open-loop call has its own)
    hashes: list[int]
    contents: list[int]
    attempt: int = 1
    offered_s: float = 0.0
    dispatched_s: float | None = None
    request: CallRequest | None = None
    replica: int = -1
    model_served: str | None = None
    avoid: tuple[str, ...] = ()
    # disaggregated attempt: its prefill replica, the KV pull, the prefill leg's cost
    prefill_replica: int = -1
    transfer_s: float = 0.0
    transferred_tokens: int = 0
    prefill_cost: float = 0.0


def new_call(task: TaskState, k: int, block_size: int) -> SimCall:
    """Call ``k`` of ``task`` as it arrives, its blocks named (see :mod:`taskplane.sim.blocks`)."""
    spec = task.spec
    cs = spec.calls[k]
    bs = block_size
    if cs.at_s is not None:  # open loop: explicit prompt
        prompt = cs.prompt_tokens or (len(cs.contents or []) * bs)
        contents = list(cs.contents or [])
        hashes: list[int] = []
        extend_hashes(spec, contents, hashes, min(len(contents), prompt // bs), bs)
        n_prompt = n_total = len(hashes)
    else:
        task.ctx += cs.append_tokens
        prompt = task.ctx
        n_prompt = prompt // bs
        n_total = (prompt + cs.output_tokens) // bs
        extend_hashes(spec, task.contents, task.hashes, n_total, bs)
        hashes, contents = task.hashes, task.contents
    return SimCall(task=task, step=k, prompt_tokens=prompt, output_tokens=max(1, cs.output_tokens),
                   n_prompt_blocks=n_prompt, n_total_blocks=n_total, key=f"{spec.task_id}:{k}:1",
                   hashes=hashes, contents=contents)


def call_request(call: SimCall, t: float, block_size: int, hints: HintMode = HintMode.EXACT) -> CallRequest:
    """The call as the scheduler sees it at ``t`` (deadline budget left, cost sunk so far);
    its steps remaining are what the SDK would send under ``hints``
    (:mod:`taskplane.sim.hints`)."""
    task, spec = call.task, call.task.spec
    budget = None if task.deadline_abs is None else (task.deadline_abs - t) * 1000.0
    if not spec.headers:  # a plain client: nothing but the prompt
        return CallRequest(
            model=spec.model, prompt_tokens=call.prompt_tokens, max_tokens=call.output_tokens,
            block_hashes=call.hashes[: call.n_prompt_blocks], tenant=spec.tenant, now_s=t, call_id=call.key,
            block_size=block_size, tokenized=True, avoid_replicas=call.avoid,
        )
    return CallRequest(
        model=spec.model, prompt_tokens=call.prompt_tokens, max_tokens=call.output_tokens,
        block_hashes=call.hashes[: call.n_prompt_blocks], tenant=spec.tenant, priority=spec.priority,
        session_id=spec.session_id or spec.task_id, task_id=spec.task_id, step=call.step,
        steps_remaining=steps_hint(spec, call.step, hints), budget_ms=budget, sunk_cost_usd=task.cost,
        allow_fallback=spec.allow_fallback, now_s=t, agent=spec.agent, call_id=call.key, block_size=block_size,
        tokenized=True, avoid_replicas=call.avoid,
        tool=spec.calls[call.step].tool if call.step > 0 else None,  # the SDK's hint: the tool that ran
        adapter=spec.adapter,
    )


def engine_request(call: SimCall, block_size: int, with_tokens: bool) -> SimRequest:
    """The attempt as the engine sees it; ``with_tokens`` when its KV events are consumed
    (BlockStored then carries the blocks' tokens)."""
    hashes, n_prompt = call.hashes, call.n_prompt_blocks
    # the request's prompt hashes are the same slice (read-only on both sides)
    prompt_hashes = call.request.block_hashes if call.request is not None else hashes[:n_prompt]
    # the contents list is shared, not copied: a task's list only grows (past this
    # call's blocks, which the engine never reads beyond)
    tokens = RepeatedBlocks(call.contents, block_size, call.prompt_tokens + call.output_tokens) if with_tokens else None
    return SimRequest(req_id=call.key, prompt_tokens=call.prompt_tokens, output_tokens=call.output_tokens,
                      block_hashes=prompt_hashes, output_block_hashes=hashes[n_prompt: call.n_total_blocks],
                      token_ids=tokens, tag=call, adapter=call.task.spec.adapter)


def call_record(call: SimCall, t: float, *, outcome: Outcome, error: str | None, replica: str | None,
                gpu: str | None, ev: Finished | None, cost: float, prefill_replica: str | None = None) -> CallRecord:
    """The record of the call's current attempt, ended at ``t`` (``ev``: the engine's
    account, when it reached one)."""
    spec = call.task.spec
    if ev is None:
        cached = completion = 0
        admitted = first_token = None
        gpu_s = load_s = 0.0
    else:
        load_s = ev.tier_load_s
        cached, completion, admitted, first_token, gpu_s = (
            ev.cached_tokens, ev.output_tokens, ev.admitted, ev.first_token, ev.gpu_seconds)
    return CallRecord(
        attempt_key=call.key, task_id=spec.task_id, step=call.step, attempt=call.attempt,
        session_id=spec.session_id or spec.task_id, tenant=spec.tenant, agent=spec.agent,
        priority=spec.priority, model_requested=spec.model, model_served=call.model_served, replica=replica,
        gpu=gpu, prompt_tokens=call.prompt_tokens, cached_tokens=cached, completion_tokens=completion,
        offered_s=call.offered_s, dispatched_s=call.dispatched_s, admitted_s=admitted,
        first_token_s=first_token, finished_s=t, gpu_seconds=gpu_s, cost_usd=cost, outcome=outcome,
        error_type=error, tier_load_s=load_s, prefill_replica=prefill_replica,
        transfer_ms=call.transfer_s * 1000.0, transferred_tokens=call.transferred_tokens,
    )


def task_result(task: TaskState) -> TaskResult:
    """The task's outcome at the end of the run (RUNNING if it had not ended)."""
    spec = task.spec
    status = task.status or TaskStatus.RUNNING
    met = None
    if task.deadline_abs is not None and task.status is not None:
        met = status == TaskStatus.SUCCEEDED and (task.finished_s or 0.0) <= task.deadline_abs
    elif task.status is not None:
        met = status == TaskStatus.SUCCEEDED
    return TaskResult(
        task_id=spec.task_id, agent=spec.agent, tenant=spec.tenant, priority=spec.priority, status=status,
        arrival_s=spec.arrival_s, finished_s=task.finished_s, deadline_s=task.deadline_abs,
        deadline_met=met, cost_usd=task.cost, attempts=task.attempts, retries=task.retries,
        calls_done=task.done_calls, calls_total=len(spec.calls), error=task.failed,
    )
