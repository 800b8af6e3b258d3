"""KV tiers below the GPU: the host store's LRU and events, loads instead of recompute, the
index's tier depth and the tier-aware scorers, the bench's tier figures."""

from __future__ import annotations

from typing import Any

import numpy as np

from taskplane.bench.tiers import tier_metrics
from taskplane.scheduler.kv.events import BlockRemoved, BlockStored
from taskplane.scheduler.kvindex import KVIndex
from taskplane.scheduler.policies import build_policy
from taskplane.sim.cluster import ClusterSpec, simulate
from taskplane.sim.engine import EngineConfig, Finished, KVEvents, SimEngine, SimRequest
from taskplane.sim.gpus import model_profile
from taskplane.sim.hosttier import ReplicaTiers, TierSpec, TierStore
from taskplane.sim.workloads.agents import AgentWorkloadConfig, generate_agent_tasks
from tests.sim.test_engine_model import drive, finished


def _tiers(host_blocks: int, bs: int = 16) -> ReplicaTiers:
    return ReplicaTiers(host=TierStore(host_blocks), remote=None, block_size=bs,
                        block_bytes=model_profile("llama-3.1-8b").kv_bytes_per_token * bs)


def test_tier_store_is_lru_with_cpu_events_and_touch_on_match() -> None:
    t = TierStore(3)
    assert t.put([1, 2, 3], 16) == 3
    assert t.match([1, 2], 0, 2) == 2  # touches 1 and 2: 3 is now the oldest
    assert t.put([4], 16) == 1
    assert list(t.blocks) == [1, 2, 4]
    ev = t.take_events()
    assert [type(e) for e in ev] == [BlockStored, BlockStored, BlockRemoved]
    assert all(e.medium == "CPU" for e in ev)
    assert ev[0].token_ids == [] and ev[0].parent_block_hash is None  # as vLLM's offloading connector
    assert ev[2].block_hashes == [3]
    assert t.match([1, 2, 3, 4], 0, 4) == 2  # a run stops at the first missing block


def _evict_then_return(tiers: ReplicaTiers | None) -> tuple[Finished, SimEngine]:
    """Request a (64 blocks), then b (an unrelated 64 blocks) evicts it from a 100-block GPU
    cache, then a's prompt again."""
    e = SimEngine(EngineConfig(gpu="h100", kv_blocks=100, block_size=16), tiers=tiers)
    a, b = list(range(1, 65)), list(range(1001, 1065))
    ev = drive(e, [(0.0, SimRequest("a", 1024, 8, a)), (5.0, SimRequest("b", 1024, 8, b)),
                   (10.0, SimRequest("a2", 1024, 8, a))])
    return finished(ev)["a2"], e


def test_host_tier_turns_an_evicted_prefix_into_a_load_not_a_recompute() -> None:
    gpu_only, _ = _evict_then_return(None)
    tiered, eng = _evict_then_return(_tiers(1000))
    assert gpu_only.cached_tokens < 40 * 16  # its tail was evicted (released tail first): recomputed
    assert tiered.cached_tokens == 63 * 16  # loaded from host (the last block is recomputed, as vLLM)
    ttft_gpu, ttft_tier = gpu_only.first_token - gpu_only.arrival, tiered.first_token - tiered.arrival
    assert ttft_tier < ttft_gpu
    assert ttft_tier > 0.0008  # the load is not free: it sits in the step that admits the request
    st = eng.tiers.stats
    loaded = 63 * 16 - gpu_only.cached_tokens  # what the GPU lost, and only that, comes from host
    assert st.host_hit_tokens == loaded and st.loaded_tokens == loaded and st.load_s > 0
    assert st.offloaded_tokens >= 128 * 16  # every computed block of a and b written through


def test_engine_events_carry_medium_and_the_index_tracks_host_depth() -> None:
    tiers = _tiers(1000)
    e = SimEngine(EngineConfig(gpu="h100", kv_blocks=100, block_size=16), tiers=tiers)
    tokens = list(range(1024))
    from taskplane.scheduler.hashing import chain_hashes

    hs = chain_hashes(tokens, 16)
    other = chain_hashes(list(range(5000, 6024)), 16)
    ev = drive(e, [(0.0, SimRequest("a", 1024, 8, hs, token_ids=tokens)),
                   (5.0, SimRequest("b", 1024, 8, other, token_ids=list(range(5000, 6024))))])
    batches = [x.events for x in ev if isinstance(x, KVEvents)]
    media = {getattr(x, "medium", None) for b in batches for x in b}
    assert media >= {"GPU", "CPU"}
    idx = KVIndex(metrics=False)
    for b in batches:
        idx.apply_events("r0", b)
    rid = idx.slots.ids_of(["r0"])
    gpu = idx.match_ids(hs, rid).astype(np.float64)
    deep = idx.precise.tiers.depths(hs, rid, gpu)
    assert gpu[0] < 64 and deep[0] == 64  # a left the GPU but its host copy covers the prompt


def _agents(n: int = 30, rate: float = 0.6) -> Any:
    return generate_agent_tasks(AgentWorkloadConfig(n_tasks=n, arrival_rate_per_s=rate, seed=4))


def test_tiers_in_the_cluster_raise_hits_and_report_figures() -> None:
    wl = _agents()
    small = dict(kv_blocks=60)
    base = simulate(ClusterSpec.fleet("h100:2", **small), wl, build_policy("llm-d-tiered", seed=1, metrics=False),
                    seed=1)
    spec = ClusterSpec.fleet("h100:2", **small)
    spec.tiers = TierSpec(host_kv_gb=64)
    tiered = simulate(spec, wl, build_policy("llm-d-tiered", seed=1, metrics=False), seed=1)
    hit = sum(r.prefix_hits for r in tiered.replicas)
    assert hit > sum(r.prefix_hits for r in base.replicas)
    m = tier_metrics(tiered, wl)
    assert 0 < m["host_tier_hit_share"] <= 1 and m["tier_moved_tokens"] > 0
    assert m["tool_gap_ttft_p99_ms"] is not None and m["warm_ttft_p99_ms"] is not None
    assert tier_metrics(base, wl)["host_tier_hit_share"] == 0.0


def test_tier_aware_presets_credit_host_blocks() -> None:
    wl = _agents(20)
    for name in ("llm-d-tiered", "dynamo-kvbm", "continuum-ttl", "taskplane"):
        spec = ClusterSpec.fleet("h100:2", kv_blocks=60)
        spec.tiers = TierSpec(host_kv_gb=64)
        res = simulate(spec, wl, build_policy(name, seed=1, metrics=False), seed=1)
        assert sum(r.host_hit_tokens for r in res.replicas) > 0, name


def test_lifetime_planner_keeps_short_gaps_prefetches_long_ones_and_drops_finished_sessions() -> None:
    from taskplane.scheduler.kv.lifetimes import Lifetime, LifetimePlanner, ToolHint

    p = LifetimePlanner(min_samples=2)
    for g in (0.2, 0.3, 0.25):
        p.observe_gap("coder", "grep", g)
    for g in (7.0, 9.0, 8.0):
        p.observe_gap("coder", "run_tests", g)
    assert p.plan(ToolHint("coder", "grep", 5), kv_usage=0.3, load_s=0.01).action is Lifetime.KEEP
    assert p.plan(ToolHint("coder", "grep", 5), kv_usage=0.95, load_s=0.01).action is Lifetime.HOST  # pressure
    long = p.plan(ToolHint("coder", "run_tests", 5), kv_usage=0.3, load_s=0.05)
    assert long.action is Lifetime.HOST and long.prefetch_in_s is not None
    assert 0 < long.prefetch_in_s < 8.0 - 0.05  # ahead of the expected return, by the spread and the load
    tight = p.plan(ToolHint("coder", "run_tests", 5, slack_s=3.0), kv_usage=0.3, load_s=0.05)
    assert tight.prefetch_in_s is not None and tight.prefetch_in_s < long.prefetch_in_s
    assert p.plan(ToolHint("coder", None, 0), kv_usage=0.3, load_s=0.0).action is Lifetime.DROP


def test_engine_prefetch_and_drop() -> None:
    tiers = _tiers(1000)
    e = SimEngine(EngineConfig(gpu="h100", kv_blocks=100, block_size=16), tiers=tiers)
    a, b = list(range(1, 65)), list(range(1001, 1065))
    drive(e, [(0.0, SimRequest("a", 1024, 8, a)), (5.0, SimRequest("b", 1024, 8, b))])
    before = e.kv.match(a, 64)
    assert before < 64
    assert e.prefetch(a, None, 10.0) == 64 - before
    assert e.kv.match(a, 64) == 64 and tiers.stats.prefetched_tokens == (64 - before) * 16
    f = finished(drive(e, [(11.0, SimRequest("a2", 1024, 8, a))]))["a2"]
    assert f.cached_tokens == 63 * 16 and tiers.stats.host_hit_tokens == 0  # a GPU hit now
    free = e.free_blocks()
    assert e.drop(a[10:], 12.0) == 54 and e.free_blocks() == free  # evictable -> free: same count
    assert e.kv.match(a, 64) == 10 and e.kv.free_uncached >= 54


def test_taskplane_lifetimes_run_in_the_cluster_with_tiers() -> None:
    from taskplane.scheduler.kv.lifetimes import LifetimePlanner

    wl = _agents(30)
    spec = ClusterSpec.fleet("h100:2", kv_blocks=60)
    spec.tiers = TierSpec(host_kv_gb=64)
    res = simulate(spec, wl, build_policy("taskplane", seed=1, metrics=False), seed=1, kv_lifetimes=LifetimePlanner())
    c = res.kv_lifetimes
    assert c["drop"] > 0 and c["host"] + c["keep"] > 0 and c["prefetches"] > 0
    assert sum(r.prefetched_tokens for r in res.replicas) > 0
    gpu_only = simulate(ClusterSpec.fleet("h100:2", kv_blocks=60), wl, build_policy("taskplane", seed=1, metrics=False),
                        seed=1, kv_lifetimes=LifetimePlanner())
    assert gpu_only.kv_lifetimes == {}  # nothing to carry out without tiers


def test_simulated_calls_carry_the_tool_hint_and_the_scheduler_learns_each_tools_gap() -> None:
    wl = _agents(30)
    spec = ClusterSpec.fleet("h100:2", kv_blocks=60)
    spec.tiers = TierSpec(host_kv_gb=64)
    sched = build_policy("taskplane", seed=1, metrics=False)
    simulate(spec, wl, sched, seed=1)
    hints = sched.pipeline.tool_hints
    assert hints is not None
    after_tool = [(t.agent, c.tool, c.gap_s) for t in wl.tasks for c in t.calls[1:]]
    assert 0 < hints.hints <= len(after_tool)  # retries and the last call of a task aside
    # the planner's gap per (agent, tool) is learned from what the workload's tools took
    agent, tool, _ = after_tool[0]
    gaps = [g for a, tl, g in after_tool if (a, tl) == (agent, tool)]
    assert len(gaps) >= hints.planner.min_samples  # so expected_gap is the tool's own, not a default
    mean, _std = hints.planner.expected_gap(agent, tool)
    assert min(gaps) <= mean <= max(gaps) + 1.0  # the scheduler sees the gap plus queueing
    assert sum(hints.plans.values()) > 0 and hints.plans.get("drop", 0) > 0


def test_bench_refuses_tiers_for_real_engines_and_negative_sizes(tmp_path: Any) -> None:
    import pytest

    from taskplane.bench.command import run_bench
    from taskplane.bench.options import BenchOptions
    from taskplane.errors import UserError

    with pytest.raises(UserError, match="--engine sim"):
        run_bench(BenchOptions(out=tmp_path, workload="agents", engine="vllm", host_kv_gb=8.0))
    with pytest.raises(UserError, match=">= 0"):
        run_bench(BenchOptions(out=tmp_path, workload="agents", host_kv_gb=-1.0))
