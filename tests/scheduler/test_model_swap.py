"""Several base models per replica, as the scheduler sees them: pools with the replicas hosting
a model asleep, a swap priced in the prediction, and the swap gate's rules."""

from __future__ import annotations

from typing import Any

from _sched_util import replica, request, tokens

from taskplane.scheduler.policies import build_policy
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.types import Action, Decision, ReplicaView

A, B = "model-a", "model-b"


def _view(name: str, awake: str, *, asleep: tuple[str, ...] = (), **kw: Any) -> ReplicaView:
    return replica(name, model=awake, models_asleep=frozenset(asleep), **kw)


def _decide(views: list[ReplicaView], model: str = A, now: float = 100.0, **kw: Any) -> Decision:
    policy = build_policy("taskplane", metrics=False)
    req = request(tokens(1, 8), model=model, max_tokens=100, task_id="t1", session_id="t1", step=0,
                  call_id="c1", now_s=now, **kw)
    return policy.decide(req, views, now)


def test_pool_holds_the_replicas_hosting_a_model_asleep_and_a_single_model_table_none() -> None:
    table = ReplicaTable([_view("r0", A), _view("r1", B, asleep=(A,))])
    assert list(table.pool(A)) == [0, 1] and list(table.pool(B)) == [1]
    mask = table.asleep_mask(table.pool(A), A)
    assert mask is not None and mask.tolist() == [False, True]
    single = ReplicaTable([_view("r0", A), _view("r1", B)])
    assert single.asleep_mask(single.pool(A), A) is None


def test_a_warm_replica_wins_when_it_can_serve_even_busier_than_the_asleep_one() -> None:
    views = [_view("r0", A, num_running=6, inflight_decode_tokens=600), _view("r1", B, asleep=(A,)),
             _view("r2", B, asleep=(A,))]
    d = _decide(views)
    assert d.action == Action.PLACE and d.replica == "r0"


def test_with_no_warm_replica_a_swap_is_priced_in_the_predicted_ttft() -> None:
    d = _decide([_view("r0", B, asleep=(A,))])
    assert d.action == Action.PLACE and d.replica == "r0"
    assert d.predicted_ttft_ms is not None and d.predicted_ttft_ms >= 2000.0  # the level-1 swap prior
    warm = _decide([_view("r0", A)])
    assert warm.predicted_ttft_ms is not None and warm.predicted_ttft_ms < 500.0


def test_no_swap_of_the_last_awake_replica_of_a_model_with_calls_in_flight() -> None:
    # A's only warm replica is saturated; B's only replica has calls in flight: the call waits
    views = [_view("r0", A, num_waiting=4, num_running=20), _view("r1", B, asleep=(A,), num_running=3,
                                                                     inflight_decode_tokens=300)]
    d = _decide(views)
    assert d.replica != "r1"
    assert d.action in (Action.QUEUE, Action.PLACE)


def test_a_swap_pays_from_a_model_with_slack_and_goes_where_nothing_drains() -> None:
    # as above, but B has a second replica, idle: B can spare one, and the idle one drains nothing
    views = [_view("r0", A, num_waiting=4, num_running=20),
             _view("r1", B, asleep=(A,), num_running=3, inflight_decode_tokens=300),
             _view("r2", B, asleep=(A,))]
    d = _decide(views)
    assert d.action == Action.PLACE and d.replica == "r2"
    assert d.predicted_ttft_ms is not None and d.predicted_ttft_ms >= 2000.0


def test_a_replica_mid_swap_prices_what_is_left_of_it() -> None:
    # r0 is being woken for A, ready at t=103 (3 s from now); r1 serves A warm and idle
    d = _decide([_view("r0", A, asleep=(B,), swap_ready_s=103.0), _view("r1", A, asleep=(B,))])
    assert d.replica == "r1"
    alone = _decide([_view("r0", A, asleep=(B,), swap_ready_s=103.0)])
    assert alone.predicted_ttft_ms is not None and alone.predicted_ttft_ms >= 3000.0
