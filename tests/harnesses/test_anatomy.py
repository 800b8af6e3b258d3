"""The TTFT anatomy adds up, and its bound (idle replica, infinite cache) is never beaten."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.anatomy import anatomy, band, idle_infinite_cache_ttft_s, ttft_parts
from taskplane.bench.ceiling import ceiling_tokens, open_call_hits
from taskplane.sim.cluster import ClusterSpec, ReplicaSpec, round_robin, simulate
from taskplane.sim.hosttier import TierSpec
from taskplane.sim.workloads.mooncake import load_mooncake

LINES = [  # a shared system prefix, three conversations, bursts that queue on one replica
    '{"timestamp": 0, "input_length": 20000, "output_length": 20, "hash_ids": [0, 1, 2, 3]}',
    '{"timestamp": 10, "input_length": 16000, "output_length": 20, "hash_ids": [0, 7, 8]}',
    '{"timestamp": 20, "input_length": 9000, "output_length": 20, "hash_ids": [0, 9]}',
    '{"timestamp": 30000, "input_length": 24000, "output_length": 20, "hash_ids": [0, 1, 2, 3, 4, 5]}',
    '{"timestamp": 30010, "input_length": 21000, "output_length": 20, "hash_ids": [0, 7, 8, 10, 11]}',
    '{"timestamp": 30020, "input_length": 3000, "output_length": 20, "hash_ids": [12]}',
]


def _trace(tmp_path: Path) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(LINES) + "\n")
    return p


def test_per_call_hits_add_up_to_the_ceiling(tmp_path: Path) -> None:
    wl = load_mooncake(_trace(tmp_path))
    per_call = open_call_hits(wl)
    assert len(per_call) == len(LINES)
    hits, prompts = ceiling_tokens(wl)
    assert sum(h for h, _ in per_call.values()) == hits > 0
    assert sum(p for _, p in per_call.values()) == prompts


def test_parts_add_up_and_no_call_beats_the_idle_infinite_cache_bound(tmp_path: Path) -> None:
    wl = load_mooncake(_trace(tmp_path))
    bound = idle_infinite_cache_ttft_s(wl)
    assert len(bound) == len(LINES) and bound.min() > 0
    one = simulate(ClusterSpec([ReplicaSpec("r0", kv_blocks=400_000)]), wl, round_robin(), seed=1)
    parts = ttft_parts(one.calls)
    assert len(parts) == len(LINES)
    for p in parts:
        assert abs(p.held + p.engine_queue + p.tier_load + p.prefill - p.ttft) < 1e-9
    measured = np.sort([p.ttft for p in parts])
    # call by call (in arrival order) no TTFT is below its bound; the burst queued
    assert np.all(np.array([p.ttft for p in parts]) >= bound - 1e-6)
    assert sum(p.engine_queue for p in parts) > 0
    assert measured[-1] > np.sort(bound)[-1]
    a = anatomy(parts)
    assert a["tail_calls"] >= 1 and a["ttft_p99_ms"] >= a["ttft_p50_ms"]


def test_host_tier_loads_are_recorded_per_call(tmp_path: Path) -> None:
    wl = load_mooncake(_trace(tmp_path))
    # a GPU cache too small to keep the conversations across the 30 s pause, a host tier that does
    spec = ClusterSpec([ReplicaSpec("r0", kv_blocks=50)])  # blocks of 512 tokens
    spec.tiers = TierSpec(host_kv_gb=64)
    res = simulate(spec, wl, round_robin(), seed=1)
    parts = ttft_parts(res.calls)
    assert any(p.tier_load > 0 for p in parts)
    assert sum(c.tier_load_s for c in res.calls) > 0
    for p in parts:
        assert abs(p.held + p.engine_queue + p.tier_load + p.prefill - p.ttft) < 1e-9


def test_a_band_splits_prefill_into_bound_colder_and_contention(tmp_path: Path) -> None:
    """On one replica the two bursts share its step budget (contention); on sixteen idle
    replicas with room for everything, round robin spreads the bursts (no contention) but
    loses the shared prefixes (colder). The parts add up to the band's mean TTFT."""
    wl = load_mooncake(_trace(tmp_path))
    crowded = simulate(ClusterSpec([ReplicaSpec("r0", kv_blocks=400_000)]), wl, round_robin(), seed=1)
    spread = simulate(ClusterSpec([ReplicaSpec(f"r{i}", kv_blocks=400_000) for i in range(16)]), wl,
                      round_robin(), seed=1)
    parts = ("held", "engine_queue", "tier_load", "bound", "colder", "contention")
    for run in (crowded, spread):
        b = band(run, wl, 0.0, 1.0)
        assert b["calls"] == len(LINES)
        assert abs(sum(b[f"{k}_mean_ms"] for k in parts) - b["ttft_mean_ms"]) < 1e-6
        assert b["colder_mean_ms"] >= -1e-6
        assert band(run, wl, 0.5, 1.0)["calls"] < len(LINES)
    one, many = band(crowded, wl, 0.0, 1.0), band(spread, wl, 0.0, 1.0)
    assert one["contention_mean_ms"] + one["engine_queue_mean_ms"] > many["contention_mean_ms"] + many["engine_queue_mean_ms"]
    assert many["colder_mean_ms"] > one["colder_mean_ms"]
