"""``bench --pd``: the P:D flag and the side-by-side metrics of one small run."""

from __future__ import annotations

import pytest

from taskplane.bench.pd import parse_pd, pd_fleet, pd_metrics
from taskplane.bench.workloads import agent_tenants, agent_workload
from taskplane.errors import UserError
from taskplane.scheduler.policies import build_policy
from taskplane.sim.cluster import ClusterSpec
from taskplane.sim.pd_cluster import simulate_pd


def test_parse_pd() -> None:
    assert parse_pd("2:6") == (2, 6)
    for bad in ("2", "0:4", "a:b", "3:0"):
        with pytest.raises(UserError):
            parse_pd(bad)


def test_pd_fleet_roles() -> None:
    fleet = pd_fleet(1, 3)
    assert [r.role for r in fleet.replicas] == ["prefill", "decode", "decode", "decode"]


def test_metrics_side_by_side_on_the_same_gpus() -> None:
    wl = agent_workload(10, 0.5, 1)
    agg = pd_metrics(simulate_pd(ClusterSpec.fleet("h100:3"), wl,
                                 build_policy("taskplane", seed=1, tenants=agent_tenants()), seed=1))
    split = pd_metrics(simulate_pd(pd_fleet(1, 2), wl,
                                   build_policy("dynamo-disagg", seed=1, tenants=agent_tenants()), seed=1))
    assert agg["disaggregated"] == 0.0 and agg["transfer_ms_mean"] == 0.0
    assert agg["ttft_p50_ms"] is not None and agg["itl_p99_ms"] is not None
    assert split["calls"] > 0 and 0.0 <= split["disaggregated"] <= 1.0
    assert (split["transfer_ms_mean"] > 0) == (split["disaggregated"] > 0)
