"""The KV-tier figures of one policy's run: how much of the prefix hits the host
tier served, how many tokens moved between tiers, and the TTFT of the first call after a
tool gap against warm calls."""

from __future__ import annotations

from typing import Any

import numpy as np

from taskplane.bench.metrics import percentile
from taskplane.sim.results import ClusterResult, Outcome
from taskplane.sim.workloads.base import Workload

#: a call whose tool gap (the delay since its task's previous call ended) is at least this
#: long counts as "after a tool gap": its session's KV sat idle long enough to be evicted or
#: offloaded; shorter gaps are warm
TOOL_GAP_S = 1.0


def tier_metrics(result: ClusterResult, workload: Workload) -> dict[str, Any]:
    """``host_tier_hit_share``, ``remote_tier_hit_share``, ``tier_moved_tokens``,
    ``tool_gap_ttft_p99_ms``, ``warm_ttft_p99_ms`` (and their p50s) for results.json."""
    reps = result.replicas
    hits = sum(r.prefix_hits for r in reps)
    host = sum(r.host_hit_tokens for r in reps)
    remote = sum(r.remote_hit_tokens for r in reps)
    gaps = {(t.task_id, i): c.gap_s for t in workload.tasks for i, c in enumerate(t.calls)}
    first_offer: dict[tuple[str, int], float] = {}
    for c in result.calls:
        key = (c.task_id, c.step)
        first_offer[key] = min(first_offer.get(key, c.offered_s), c.offered_s)
    after_gap: list[float] = []
    warm: list[float] = []
    for c in result.calls:
        if c.outcome is not Outcome.SUCCESS or c.first_token_s is None or c.step == 0:
            continue
        ttft = c.first_token_s - first_offer[(c.task_id, c.step)]
        (after_gap if gaps.get((c.task_id, c.step), 0.0) >= TOOL_GAP_S else warm).append(ttft)
    gap_a, warm_a = np.asarray(after_gap), np.asarray(warm)
    return {
        "host_tier_hit_share": host / hits if hits else 0.0,
        "remote_tier_hit_share": remote / hits if hits else 0.0,
        "tier_moved_tokens": sum(r.loaded_tokens + r.offloaded_tokens for r in reps),
        "tier_loaded_tokens": sum(r.loaded_tokens for r in reps),
        "tier_prefetched_tokens": sum(r.prefetched_tokens for r in reps),
        "kv_lifetimes": result.kv_lifetimes or None,
        "tool_gap_calls": len(after_gap),
        "tool_gap_ttft_p50_ms": percentile(gap_a, 50, 1000.0),
        "tool_gap_ttft_p99_ms": percentile(gap_a, 99, 1000.0),
        "warm_ttft_p50_ms": percentile(warm_a, 50, 1000.0),
        "warm_ttft_p99_ms": percentile(warm_a, 99, 1000.0),
    }
