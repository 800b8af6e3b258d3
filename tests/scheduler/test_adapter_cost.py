"""The latency model's LoRA adapter load times, and the residency planner's unloads by demand."""

from __future__ import annotations

import pytest
from _sched_util import replica, request
from test_plugins import make_state

from taskplane.scheduler.adapter_cost import AdapterCosts
from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Kind
from taskplane.scheduler.framework.registry import REGISTRY
from taskplane.scheduler.policies import build_policy
from taskplane.scheduler.table import ReplicaTable

ALL = frozenset({"a", "b", "c", "d", "e"})


def _pool() -> list:  # type: ignore[type-arg]
    """Three idle-looking replicas alike but for where adapter ``a`` is."""
    return [replica("gpu", max_loras=4, lora_served=ALL, lora_running=frozenset({"a"}), num_running=1),
            replica("host", max_loras=4, lora_served=ALL, lora_running=frozenset({"b"}), num_running=1),
            replica("cold", max_loras=4, lora_served=ALL, lora_running=frozenset({"b"}), num_running=1)]


def _ttft(pool: list, req, sched=None) -> dict[str, float]:  # type: ignore[no-untyped-def,type-arg]
    state = make_state(pool, req, sched)
    return {v.name: float(t) for v, t in zip(pool, state.prediction.ttft_ms, strict=True)}


def test_a_cold_adapter_predicts_a_longer_ttft_than_a_gpu_resident_one() -> None:
    sched = build_policy("taskplane", seed=0, metrics=False)
    residency = next(s for s in sched.pipeline.scorers if s.type_name == "adapter-residency")
    residency.preloaded("host", "a")  # the picker's mirror: a's host copy is on "host"
    t = _ttft(_pool(), request(adapter="a"), sched)
    costs = AdapterCosts()
    assert t["gpu"] < t["host"] < t["cold"]
    assert t["cold"] - t["gpu"] == pytest.approx((costs.disk_load_s + costs.gpu_load_s) * 1000.0, abs=5.0)
    assert t["host"] - t["gpu"] == pytest.approx(costs.gpu_load_s * 1000.0, abs=5.0)
    # the one-candidate path (a pinned session) gives the same floats as the array path
    table = ReplicaTable(_pool())
    for row, name in enumerate(("gpu", "host", "cold")):
        one = OneCandidate(sched.pipeline.handle, request(adapter="a"), table, row, 0.0)
        assert one.prediction.ttft_ms == t[name]


def test_a_call_without_adapter_predicts_the_same_ttft_wherever_adapters_are() -> None:
    sched = build_policy("taskplane", seed=0, metrics=False)
    t = _ttft(_pool(), request(), sched)
    assert len(set(t.values())) == 1
    plain = [replica(v.name, num_running=1) for v in _pool()]
    assert _ttft(plain, request(), sched) == t  # exactly what the model predicts without LoRA


def test_adapter_costs_come_from_the_scheduler_config() -> None:
    slow_disk = build_policy({"policy": "taskplane", "adapter_costs": {"disk_load_s": 2.0}}, metrics=False)
    t = _ttft(_pool(), request(adapter="a"), slow_disk)
    assert t["cold"] - t["gpu"] == pytest.approx(2005.0, abs=30.0)


def _planner(**params: object):  # type: ignore[no-untyped-def]
    return REGISTRY.build(Kind.SCORER, {"type": "adapter-residency",
                                        "params": {"preload": True, "unload": True, **params}})


def _place(plugin, name: str, adapter: str, session: str, now: float) -> None:  # type: ignore[no-untyped-def]
    pool = [replica(name, max_loras=2, lora_served=ALL)]
    state = make_state(pool, request(adapter=adapter, session_id=session))
    state.now_s = now
    plugin.placed(state, pool[0], None)


def test_the_planner_unloads_the_least_demanded_adapter_not_a_busy_one() -> None:
    plugin = _planner()
    for k in range(6):  # a: many calls, b: some, c: one, d: a session still pinned
        _place(plugin, "r0", "a", f"sa{k}", 0.1 * k)
    for k in range(3):
        _place(plugin, "r0", "b", f"sb{k}", 0.1 * k)
    _place(plugin, "r0", "c", "sc", 0.0)
    plugin.task_ended("sc")
    _place(plugin, "r0", "d", "sd", 0.0)
    plugin.task_ended("sd")
    r0 = replica("r0", max_loras=2, lora_served=ALL)
    r1 = replica("r1", max_loras=2, lora_served=ALL)
    assert plugin.unloads([r0, r1], 1.0) == [("r0", "c")]  # a and b keep the two GPU slots
    # running there protects the least demanded adapter: the next least demanded goes
    c_runs = replica("r0", max_loras=2, lora_served=ALL, lora_running=frozenset({"c"}))
    assert plugin.unloads([c_runs, r1], 1.0) == [("r0", "d")]
    # the last replica serving an adapter keeps it
    only_here = replica("r1", max_loras=2, lora_served=frozenset({"a", "b"}))
    assert plugin.unloads([r0, only_here], 1.0) == []
    plugin.unloaded("r0", "c")
    assert plugin.where("r0", "c") is None


def test_a_pinned_session_keeps_its_adapter_loaded() -> None:
    plugin = _planner()
    for k in range(4):
        _place(plugin, "r0", "a", f"sa{k}", 0.0)
        _place(plugin, "r0", "b", f"sb{k}", 0.0)
    _place(plugin, "r0", "c", "live", 0.0)  # one call, its session not ended
    r0, r1 = replica("r0", max_loras=2, lora_served=ALL), replica("r1", max_loras=2, lora_served=ALL)
    assert plugin.unloads([r0, r1], 1.0) == []
    plugin.task_ended("live")
    assert plugin.unloads([r0, r1], 1.0) == [("r0", "c")]


def test_no_unloads_without_the_setting_or_with_a_slot_for_every_adapter() -> None:
    off = _planner(unload=False)
    on = _planner()
    for plugin in (off, on):
        for a in ("a", "b"):
            _place(plugin, "r0", a, f"s{a}", 0.0)
            plugin.task_ended(f"s{a}")
    pool = [replica("r0", max_loras=2, lora_served=ALL), replica("r1", max_loras=2, lora_served=ALL)]
    assert off.unloads(pool, 1.0) == [] and on.unloads(pool, 1.0) == []
