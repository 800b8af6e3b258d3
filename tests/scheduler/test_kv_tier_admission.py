"""Working-set room with a host KV tier, and the SDK's "in a tool" hint in the scheduler."""

from __future__ import annotations

import pytest

from taskplane.context import H_TOOL, CallContext, parse_headers
from taskplane.errors import ErrorType, TaskplaneError
from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.scheduler.policies import build_policy
from taskplane.scheduler.types import Action, CallOutcome, CallRequest, ReplicaView

BS = 16


def _view(name: str, *, blocks: int = 100, host: int = 0) -> ReplicaView:
    return ReplicaView(name=name, model="m", gpu="h100", cost_per_hour_usd=2.5, kv_blocks_total=blocks,
                       kv_blocks_free=blocks, block_size=BS, has_kv_events=False, kv_host_blocks_total=host)


def _first(task: str, tokens: int = 900) -> CallRequest:
    return CallRequest(model="m", prompt_tokens=tokens, max_tokens=100, tenant="t", session_id=task, task_id=task,
                       step=0, steps_remaining=2, call_id=f"{task}:0", block_size=BS, agent="a")


def _second_task_after_one_in_flight(share: float, host: int) -> Action:
    """Task A's context fills 1,000 of the replica's 1,600 GPU tokens; what happens to B?"""
    sched = build_policy("taskplane", seed=1, metrics=False,
                         admission=AdmissionSettings(working_set_host_share=share, hold_pays=False,
                                                     working_set_short_queue_ms=None))
    fleet = [_view("r0", host=host)]
    d = sched.decide(_first("A"), fleet, 0.0)
    assert d.action == Action.PLACE
    sched.observe_completion(_first("A"), CallOutcome(replica="r0", completion_tokens=100), 1.0)
    return sched.decide(_first("B"), fleet, 1.5).action


def test_host_tier_counts_as_room_only_at_a_positive_share() -> None:
    # GPU only: no room for B next to A (2,000 tokens > 0.75 x 1,600)
    assert _second_task_after_one_in_flight(0.0, host=0) == Action.QUEUE
    # the default share is 0: a host tier changes nothing
    assert AdmissionSettings().working_set_host_share == 0.0
    assert _second_task_after_one_in_flight(0.0, host=400) == Action.QUEUE
    # at a share of 0.5, 400 host blocks add 200 blocks (3,200 tokens) of room: B is placed
    assert _second_task_after_one_in_flight(0.5, host=400) == Action.PLACE
    # a replica without a host tier is unaffected by the share
    assert _second_task_after_one_in_flight(0.5, host=0) == Action.QUEUE


def test_tool_header_round_trips_and_is_rejected_when_malformed() -> None:
    ctx = CallContext(task_id="t1", tool="run_tests")
    headers = ctx.to_headers()
    assert headers[H_TOOL] == "run_tests"
    assert parse_headers(headers).tool == "run_tests"
    assert H_TOOL not in CallContext(task_id="t1").to_headers()
    assert parse_headers({}).tool is None
    with pytest.raises(TaskplaneError, match="x-taskplane-tool") as err:
        parse_headers({H_TOOL: "bad\x01name"})
    assert err.value.error_type == ErrorType.INVALID_REQUEST


def _call(step: int, left: int, tool: str | None, now: float) -> CallRequest:
    return CallRequest(model="m", prompt_tokens=200, max_tokens=50, tenant="t", session_id="s", task_id="s",
                       step=step, steps_remaining=left, call_id=f"s:{step}", block_size=BS, agent="coder",
                       now_s=now, tool=tool)


def test_tool_hint_teaches_the_lifetime_planner_the_gap_per_tool() -> None:
    sched = build_policy("taskplane", seed=1, metrics=False)
    hints = sched.pipeline.tool_hints
    assert hints is not None
    fleet = [_view("r0", blocks=1000)]
    t = 0.0
    for step in range(5):  # each call after the first follows a 4 s run of "pytest"
        req = _call(step, 4 - step, "pytest" if step else None, t)
        assert sched.decide(req, fleet, t).action == Action.PLACE
        sched.observe_completion(req, CallOutcome(replica="r0", completion_tokens=50), t + 1.0)
        t += 5.0
    assert hints.hints == 4
    mean, std = hints.planner.expected_gap("coder", "pytest")
    assert abs(mean - 4.0) < 1e-9 and std < 1e-9
    # four calls had steps left (planned keep or host), the last had none (drop)
    assert hints.plans.get("drop") == 1 and sum(hints.plans.values()) == 5
    # a baseline has no lifetimes: no hook
    assert build_policy("llm-d-scorers", seed=1, metrics=False).pipeline.tool_hints is None
