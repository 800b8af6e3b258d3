"""The adapter-affinity scorer on ReplicaViews: warm > queued > free slot > eviction."""

from __future__ import annotations

import pytest
from _sched_util import replica, request
from test_plugins import scores

from taskplane.errors import ConfigError
from taskplane.scheduler.framework.plugin import Kind
from taskplane.scheduler.framework.registry import REGISTRY


def lora_pool() -> list:
    return [
        replica("warm", max_loras=2, lora_running=frozenset({"a", "b"})),
        replica("queued", max_loras=2, lora_running=frozenset({"b"}), lora_waiting=frozenset({"a"})),
        replica("free", max_loras=2, lora_running=frozenset({"c"})),
        replica("full", max_loras=2, lora_running=frozenset({"c"}), lora_waiting=frozenset({"d"})),
        replica("plain"),
    ]


def test_ranks_by_load_time_saved() -> None:
    s = scores("adapter-affinity", lora_pool(), request(adapter="a"))
    assert s == {"warm": 1.0, "queued": 0.9, "free": 0.5, "full": 0.0, "plain": 0.5}


def test_calls_without_adapter_score_the_same_everywhere() -> None:
    s = scores("adapter-affinity", lora_pool(), request())
    assert set(s.values()) == {0.0}


def test_settings_are_documented_and_checked() -> None:
    s = scores("adapter-affinity", lora_pool(), request(adapter="a"), params={"free_slot_score": 0.7})
    assert s["free"] == 0.7
    with pytest.raises(ConfigError):
        REGISTRY.build(Kind.SCORER, {"type": "adapter-affinity", "params": {"evict_score": 2.0}})


def test_load_balance_keeps_the_replica_where_a_calls_adapter_runs() -> None:
    from test_plugins import kept

    loads = [6, 14, 9, 11, 10, 8, 12, 10, 9, 11, 13, 7, 10, 10, 9, 11]
    pool = [replica(f"r{i}", num_running=n, max_loras=4, lora_running=frozenset({"a"} if i == 1 else ()))
            for i, n in enumerate(loads)]
    new_task = {"task_id": "t", "session_id": "t", "step": 0}
    near_least = {"chance_k": 0}
    assert kept("load-balance", pool, request(**new_task), near_least) == ["r0", "r5", "r11"]
    assert kept("load-balance", pool, request(adapter="a", **new_task), near_least) == ["r0", "r1", "r5", "r11"]
    assert kept("load-balance", pool, request(adapter="a", **new_task),
                {**near_least, "keep_warm_adapter": False}) == ["r0", "r5", "r11"]


def test_adapter_served_keeps_the_replicas_that_registered_the_calls_adapter() -> None:
    from test_plugins import kept

    pool = [replica("has-a", lora_served=frozenset({"a", "b"})), replica("has-b", lora_served=frozenset({"b"})),
            replica("unknown"), replica("none", lora_served=frozenset())]
    assert kept("adapter-served", pool, request(adapter="a")) == ["has-a", "unknown"]
    assert kept("adapter-served", pool, request(adapter="b")) == ["has-a", "has-b", "unknown"]
    assert kept("adapter-served", pool, request()) == ["has-a", "has-b", "unknown", "none"]  # base model: all
    only = [replica("has-b", lora_served=frozenset({"b"})), replica("none", lora_served=frozenset())]
    assert kept("adapter-served", only, request(adapter="zz")) == ["has-b", "none"]  # served nowhere: the 404 says so


def _residency(**params: object):  # type: ignore[no-untyped-def]
    return REGISTRY.build(Kind.SCORER, {"type": "adapter-residency", "params": params})


def test_residency_plans_a_holder_for_every_served_adapter_on_idle_replicas_only() -> None:
    plugin = _residency(preload=True, max_preloads=8, preload_max_running=0)
    served = frozenset({"a", "b", "c"})
    pool = [replica("r0", max_loras=2, lora_served=served), replica("r1", max_loras=2, lora_served=served),
            replica("busy", max_loras=2, lora_served=served, num_running=3), replica("plain")]
    plan = plugin.plan(pool, 0.0)
    assert len(plan) == 2 and {r for r, _ in plan} == {"r0", "r1"}  # one read per idle LoRA replica
    for replica_name, adapter in plan:
        plugin.preloaded(replica_name, adapter)
    rest = plugin.plan(pool, 1.0)
    assert {a for _, a in plan + rest} == {"a", "b", "c"} and len(rest) == 1  # the third, then nothing
    for replica_name, adapter in rest:
        plugin.preloaded(replica_name, adapter)
    assert plugin.plan(pool, 2.0) == []
    held = {a: r for r, a in plan + rest}
    s = scores("adapter-residency", pool, request(adapter="a"))
    assert set(s.values()) == {0.0}  # a fresh plugin has seen nothing: no guesses
    state_scores = {v.name: plugin._score(v.name, "a") for v in pool}
    assert state_scores[held["a"]] == 0.6 and sum(state_scores.values()) == 0.6  # the host copy it read
