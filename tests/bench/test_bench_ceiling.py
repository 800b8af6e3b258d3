"""The infinite-cache ceiling agrees with the simulator given one replica with room for everything."""

from __future__ import annotations

from pathlib import Path

from taskplane.bench.ceiling import ceiling_tokens, hit_ceiling, lru_bound
from taskplane.sim.cluster import ClusterSpec, ReplicaSpec, round_robin, simulate
from taskplane.sim.workloads.agents import AgentWorkloadConfig, generate_agent_tasks
from taskplane.sim.workloads.mooncake import load_mooncake


def _served_ratio(res) -> float:  # type: ignore[no-untyped-def]
    ok = [c for c in res.calls if c.outcome.value == "success"]
    return sum(c.cached_tokens for c in ok) / sum(c.prompt_tokens for c in ok)


def test_agent_ceiling_equals_one_unbounded_replica() -> None:
    # light load: calls rarely overlap, so the one big replica sees them in arrival order
    wl = generate_agent_tasks(AgentWorkloadConfig(n_tasks=12, arrival_rate_per_s=0.02, seed=4))
    ceiling = hit_ceiling(wl)
    big = ClusterSpec([ReplicaSpec("big", kv_blocks=2_000_000)])
    res = simulate(big, wl, round_robin(), seed=1)
    assert 0.5 < ceiling < 1.0
    assert abs(_served_ratio(res) - ceiling) < 1e-9


def test_trace_ceiling_equals_one_unbounded_replica(tmp_path: Path) -> None:
    # a hand-made trace: a shared system block, two sessions of two turns, one stranger
    lines = [
        '{"timestamp": 0, "input_length": 2048, "output_length": 10, "hash_ids": [0, 1, 2, 3]}',
        '{"timestamp": 1000, "input_length": 1536, "output_length": 10, "hash_ids": [0, 7, 8]}',
        '{"timestamp": 60000, "input_length": 3000, "output_length": 10, "hash_ids": [0, 1, 2, 3, 4, 5]}',
        '{"timestamp": 90000, "input_length": 2100, "output_length": 10, "hash_ids": [0, 7, 8, 9, 10]}',
        '{"timestamp": 95000, "input_length": 1024, "output_length": 10, "hash_ids": [11, 12]}',
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    wl = load_mooncake(trace)
    hits, prompts = ceiling_tokens(wl)
    # call 3 hits blocks 0-3 (4 x 512), call 4 hits 0, 7, 8; call 2 hits block 0
    assert hits == 512 + 4 * 512 + 3 * 512
    assert prompts == 2048 + 1536 + 3000 + 2100 + 1024
    res = simulate(ClusterSpec([ReplicaSpec("big", kv_blocks=100_000)]), wl, round_robin())
    assert abs(_served_ratio(res) - hits / prompts) < 1e-9

    # one LRU cache: unbounded it is the ceiling; with room for 5 blocks each conversation
    # is evicted by the other before its next turn, and only the shared block 0 hits
    assert lru_bound(wl, 10**6) == hits / prompts
    assert lru_bound(wl, 5) == 3 * 512 / prompts
    assert lru_bound(generate_agent_tasks(AgentWorkloadConfig(n_tasks=2, seed=1)), 10) is None
