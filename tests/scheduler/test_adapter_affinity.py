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
