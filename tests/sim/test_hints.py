"""The simulator's hints modes: a policy sees only what a live SDK would send; the true
count of steps reaches it only in ``exact`` mode (the oracle)."""

from __future__ import annotations

from typing import Any

import pytest

from taskplane.bench.suite import lifetimes_for
from taskplane.errors import UserError
from taskplane.scheduler.policies import build_policy
from taskplane.scheduler.types import CallRequest, Decision
from taskplane.sim.cluster import ClusterSpec, simulate
from taskplane.sim.hints import HintMode, noise_factor, steps_hint
from taskplane.sim.hosttier import TierSpec
from taskplane.sim.workloads.base import CallSpec, TaskSpec, Workload


class Recording:
    """A policy that remembers every request it was shown."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen: list[CallRequest] = []

    def decide(self, request: CallRequest, replicas: Any, now_s: float) -> Decision:
        self.seen.append(request)
        return self.inner.decide(request, replicas, now_s)  # type: ignore[no-any-return]

    def observe_completion(self, *a: Any) -> None:
        self.inner.observe_completion(*a)


def _task(n_calls: int, tid: str = "t0", expected: int | None = 6) -> TaskSpec:
    calls = [CallSpec(64, append_tokens=200, gap_s=0.5, tool="pytest" if k else None) for k in range(n_calls)]
    return TaskSpec(task_id=tid, arrival_s=0.0, calls=calls, agent="coder", expected_steps=expected, seed=7)


def _seen(mode: str, n_calls: int) -> list[tuple[int | None, int | None]]:
    policy = Recording(build_policy("taskplane", seed=1, metrics=False))
    simulate(ClusterSpec.fleet("h100:2", hints=mode), Workload("w", [_task(n_calls)]), policy, seed=1)
    return [(r.step, r.steps_remaining) for r in policy.seen]


def test_without_an_oracle_the_policy_cannot_tell_a_task_s_length() -> None:
    # two tasks alike in their first 5 calls, one of which goes on to 9: until call 5 the
    # policy must see the same requests (nothing of the calls still to come)
    for mode in ("none", "author"):
        short, long = _seen(mode, 5), _seen(mode, 9)
        assert long[:5] == short, mode
    assert all(left is None for _, left in _seen("none", 9))
    assert [left for _, left in _seen("author", 9)] == [5, 4, 3, 2, 1, 0, 0, 0, 0]  # the author said 6
    # the oracle does tell: the bound, not a claim
    assert _seen("exact", 9)[:5] != _seen("exact", 5)
    assert [left for _, left in _seen("exact", 9)] == list(range(8, -1, -1))


def test_noisy_hints_are_wrong_by_a_fixed_factor_per_task() -> None:
    spec = _task(20)
    f = noise_factor(spec)
    assert 0.5 <= f <= 2.0
    assert steps_hint(spec, 0, HintMode.NOISY) == max(round(20 * f), 1) - 1
    assert steps_hint(_task(20, expected=None), 3, HintMode.AUTHOR) is None  # an author who gave none


def test_bad_hint_mode_is_a_clear_error() -> None:
    with pytest.raises(UserError, match="hints must be one of none, author, noisy, exact"):
        ClusterSpec.fleet("h100:1", hints="psychic")


def _conversations() -> Workload:
    """Open-loop chats of 1 to 3 turns (no task end is ever reported)."""
    tasks = []
    for i in range(300):
        turns = 1 + i % 3
        t0 = i * 10.0  # over 50 minutes: conversations idle for 15 count as over
        calls = []
        for k in range(turns):
            blocks = [10_000 * i + j for j in range(8 * (k + 1))]
            calls.append(CallSpec(32, at_s=t0 + 30.0 * k, prompt_tokens=16 * len(blocks), contents=blocks))
        tasks.append(TaskSpec(task_id=f"c{i}", arrival_s=t0, calls=calls, agent="chat", seed=i))
    return Workload("chats", tasks)


def _lifetimes(mode: str) -> dict[str, int]:
    cluster = ClusterSpec.fleet("h100:2", hints=mode)
    cluster.tiers = TierSpec(host_kv_gb=8.0)
    res = simulate(cluster, _conversations(), build_policy("taskplane", seed=1, metrics=False), seed=1,
                   kv_lifetimes=lifetimes_for("taskplane"))
    return res.kv_lifetimes


def test_open_loop_kv_is_let_go_from_predictions_not_from_the_true_last_turn() -> None:
    oracle = _lifetimes("exact")
    assert oracle["drop"] == 300  # every conversation's true end
    predicted = _lifetimes("none")
    assert predicted["drop"] == 0  # no end is known ...
    # ... but once a third of the conversations were seen to stop after each turn, the
    # layer predicts when a session is unlikely to return, and its KV goes first
    assert predicted["demote"] > 50
    assert predicted["demote_back"] < predicted["demote"] / 2
