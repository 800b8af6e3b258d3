"""The adapter-binding scorer (AIBrix's ModelAdapter placement): least-adapters binding,
the bound replicas only, loads planned once per binding, rebinding after a failure."""

from __future__ import annotations

from _sched_util import replica, request
from test_plugins import make_state

from taskplane.scheduler.framework.plugin import Kind
from taskplane.scheduler.framework.registry import REGISTRY
from taskplane.scheduler.scorers.binding import AdapterBindingScorer
from taskplane.scheduler.scorers.residency import find_planner


def build(**params: object) -> AdapterBindingScorer:
    s = REGISTRY.build(Kind.SCORER, {"type": "adapter-binding", "params": params})
    assert isinstance(s, AdapterBindingScorer)
    return s


def test_binds_each_adapter_to_the_replica_with_fewest_adapters() -> None:
    pool = [replica("r0", max_loras=2), replica("r1", max_loras=2), replica("r2", max_loras=2)]
    s = build()
    placed = {}
    for a in ("a", "b", "c", "d"):
        out = s.score(make_state(pool, request(adapter=a)))
        assert sorted(out.tolist()) == [0.0, 0.0, 1.0]
        placed[a] = pool[int(out.argmax())].name
    assert placed == {"a": "r0", "b": "r1", "c": "r2", "d": "r0"}
    again = s.score(make_state(pool, request(adapter="b")))  # a binding holds
    assert pool[int(again.argmax())].name == "r1"
    assert s.score(make_state(pool, request())).tolist() == [0.0, 0.0, 0.0]


def test_plan_binds_the_fleets_adapters_and_loads_each_binding_once() -> None:
    pool = [replica("r0", max_loras=2, lora_served=frozenset({"x", "y"})),
            replica("r1", max_loras=2, lora_served=frozenset({"x", "y", "z"}))]
    s = build(replicas=2)
    plan = s.plan(pool, 0.0)
    assert sorted(plan) == sorted((r, a) for a in ("x", "y", "z") for r in ("r0", "r1"))
    for r, a in plan:
        s.preloaded(r, a)
    assert s.plan(pool, 1.0) == []
    assert build(preload=False).plan(pool, 0.0) == []


def test_a_failed_replica_loses_its_bindings_and_they_move() -> None:
    pool = [replica("r0", max_loras=2), replica("r1", max_loras=2)]
    s = build()
    s.score(make_state(pool, request(adapter="a")))
    assert s.replica_failed("r0") == 1
    rest = [pool[1]]
    assert s.score(make_state(rest, request(adapter="a"))).tolist() == [1.0]


def test_the_aibrix_preset_plans_loads_through_its_binding() -> None:
    from taskplane.scheduler.policies import build_policy

    assert isinstance(find_planner(build_policy("aibrix-lora", seed=1, metrics=False)), AdapterBindingScorer)
