"""Disaggregated calls in the cluster simulator: a prefill leg, a KV pull, a decode leg."""

from __future__ import annotations

from taskplane.bench.workloads import agent_tenants, agent_workload
from taskplane.scheduler.policies import build_policy
from taskplane.sim.cluster import ClusterSpec, ReplicaSpec
from taskplane.sim.pd import LinkSpec
from taskplane.sim.pd_cluster import simulate_pd
from taskplane.store.records import Outcome


def _pd_fleet() -> ClusterSpec:
    return ClusterSpec([ReplicaSpec("p-0", role="prefill"), ReplicaSpec("d-0", role="decode"),
                        ReplicaSpec("d-1", role="decode")])


def test_link_time_is_setup_plus_bytes_over_bandwidth() -> None:
    link = LinkSpec(setup_ms=2.0, gb_per_s=10.0)
    assert link.transfer_s(0, "llama-3.1-8b") == 0.0
    t1, t2 = link.transfer_s(1000, "llama-3.1-8b"), link.transfer_s(2000, "llama-3.1-8b")
    assert t1 > 0.002 and abs((t2 - 0.002) - 2 * (t1 - 0.002)) < 1e-12


def test_llm_d_pd_prefills_on_the_prefill_replica_and_decodes_elsewhere() -> None:
    wl = agent_workload(12, 0.5, 1)
    res = simulate_pd(_pd_fleet(), wl, build_policy("llm-d-pd", seed=1, tenants=agent_tenants()), seed=1)
    ok = [c for c in res.calls if c.outcome == Outcome.SUCCESS]
    assert ok and all(c.replica != "p-0" for c in ok)  # the prefill replica never decodes
    split = [c for c in ok if c.prefill_replica == "p-0"]
    assert split, "threshold 0 disaggregates every call with uncached tokens"
    assert any(c.transferred_tokens > 0 for c in split)
    assert all((c.transfer_ms > 0) == (c.transferred_tokens > 0) for c in split)
    # the pulled KV is in the decode replica's cache: the decode leg finds its prompt cached
    assert all(c.cached_tokens >= c.transferred_tokens for c in split)
    assert any(c.itl_s is not None and c.itl_s > 0 for c in split)


def test_aggregated_policy_on_the_same_fleet_never_splits() -> None:
    wl = agent_workload(6, 0.5, 1)
    res = simulate_pd(_pd_fleet(), wl, build_policy("llm-d-scorers", seed=1, tenants=agent_tenants()), seed=1)
    assert res.calls and all(c.prefill_replica is None and c.replica != "p-0" for c in res.calls)
