"""The plugin framework: registry, factories, parameter validation, errors that name the plugin."""

from __future__ import annotations

import pytest

from taskplane.errors import ConfigError
from taskplane.scheduler import build_policy, policy_names
from taskplane.scheduler.config import PluginConfig, SchedulerConfig
from taskplane.scheduler.framework.plugin import Kind
from taskplane.scheduler.framework.registry import REGISTRY
from taskplane.scheduler.policies import build_scheduler, scheduler_from_config


def test_every_plugin_documents_every_parameter() -> None:
    described = REGISTRY.describe()
    types = {(d["kind"], d["type"]) for d in described}
    for expected in [
        ("filter", "healthy"), ("filter", "tenant-gpu"), ("filter", "memory-headroom"), ("filter", "latency-budget"),
        ("scorer", "prefix-cache"), ("scorer", "session-affinity"), ("scorer", "latency"),
        ("scorer", "memory-headroom"), ("scorer", "weight-warmth"), ("scorer", "gpu-price"),
        ("scorer", "workflow-context"), ("scorer", "queue"), ("scorer", "kv-usage"),
        ("scorer", "least-loaded"), ("scorer", "dynamo-cost"),
        ("picker", "max-score"), ("picker", "round-robin"), ("picker", "consistent-hash"),
        ("picker", "sglang-cache-aware"),
    ]:
        assert expected in types
    for d in described:
        assert d["doc"], f"{d['type']} has no docstring"
        for p in d["params"]:
            assert p["doc"], f"{d['type']}.{p['name']} is undocumented"


def test_build_from_plugin_config() -> None:
    spec = PluginConfig(type="prefix-cache", weight=2.5, params={"source": "approximate"})
    scorer = REGISTRY.build(Kind.SCORER, spec, policy="t")
    assert scorer.weight == 2.5 and scorer.params.source == "approximate"
    assert scorer.name == "prefix-cache"
    # ints are accepted for float parameters and converted
    f = REGISTRY.build(Kind.FILTER, {"type": "memory-headroom", "params": {"min_free_ratio": 2}})
    assert f.params.min_free_ratio == 2.0 and isinstance(f.params.min_free_ratio, float)


@pytest.mark.parametrize(
    ("kind", "spec", "needle"),
    [
        (Kind.SCORER, {"type": "nope"}, "scheduler scorer 'nope': no such plugin type"),
        (Kind.SCORER, {"type": "prefix-cache", "params": {"sorce": "x"}}, "'prefix-cache': unknown parameter(s) sorce"),
        (Kind.SCORER, {"type": "prefix-cache", "params": {"source": "psychic"}}, "parameter source='psychic'"),
        (Kind.PICKER, {"type": "consistent-hash", "params": {"virtual_nodes": 0}}, "'consistent-hash': virtual_nodes"),
        (Kind.FILTER, {"type": "memory-headroom", "params": {"soft": "yes"}}, "parameter soft='yes' should be bool"),
        (Kind.SCORER, {"type": "latency", "weight": -1}, "'latency': weight must be"),
    ],
)
def test_config_errors_name_the_plugin(kind: Kind, spec: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        REGISTRY.build(kind, spec)
    assert needle in str(err.value)


def test_unknown_policy() -> None:
    with pytest.raises(ConfigError, match="no such preset"):
        build_policy("fastest-ever")


def test_from_scheduler_config_with_overrides() -> None:
    cfg = SchedulerConfig(
        policy="taskplane",
        scorers=[PluginConfig(type="least-loaded", weight=1.0)],
        seed=7,
        admission=False,
        response_cache_entries=16,
    )

    s = scheduler_from_config(cfg)
    assert [x.type_name for x in s.pipeline.scorers] == ["least-loaded"]
    assert [x.type_name for x in s.pipeline.filters] == [
        "healthy", "swap-gate", "tenant-gpu", "adapter-served", "memory-headroom", "latency-budget", "prefill-finish", "load-balance"
    ]
    assert s.admission is None and s.pipeline.seed == 7
    assert s.response_cache is not None and s.response_cache.max_entries == 16
    with pytest.raises(ConfigError, match="scheduler scorer 'x'"):
        scheduler_from_config({"policy": "taskplane", "scorers": [{"type": "x"}]})


def test_every_preset_builds_and_baselines_have_no_admission() -> None:
    for name in policy_names():
        s = build_policy(name, seed=1)
        assert s.name == name
        assert (s.admission is not None) == name.startswith("taskplane")  # taskplane and taskplane-pd
    # a baseline never gains admission control from the config flag
    assert build_scheduler(policy="round-robin", admission=True).admission is None


def test_docs_cover_every_plugin_and_preset() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "scheduler.md").read_text(encoding="utf-8")
    for d in REGISTRY.describe():
        assert f"`{d['type']}`" in doc, f"docs/scheduler.md does not mention plugin {d['type']}"
        for p in d["params"]:
            assert f"`{p['name']}`" in doc, f"docs/scheduler.md does not mention {d['type']}.{p['name']}"
    for name in policy_names():
        assert f"`{name}`" in doc
