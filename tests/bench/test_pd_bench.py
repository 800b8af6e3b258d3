"""``bench --pd``: the P:D flag and the side-by-side metrics of one small run."""

from __future__ import annotations

import pytest

from taskplane.bench.pd import _point, parse_pd, parse_roles, pd_fleet, pd_metrics
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


def test_parse_roles() -> None:
    assert parse_roles("fixed") == ["fixed"]
    assert parse_roles("auto, fixed") == ["fixed", "auto"]  # always run in the same order
    assert parse_roles("lend,auto,fixed") == ["fixed", "auto", "lend"]
    for bad in ("", "dynamic", "fixed,,x"):
        with pytest.raises(UserError):
            parse_roles(bad)


def test_role_modes_are_rows_beside_the_fixed_split() -> None:
    wl = agent_workload(30, 1.5, 1)
    rows = _point(wl, 2, 2, 1, ["taskplane", "taskplane-pd"], ("fixed", "auto", "lend"))
    assert list(rows) == ["taskplane", "taskplane-pd (2P:2D)", "taskplane-pd (2P:2D, auto roles)",
                          "taskplane-pd (2P:2D, lend roles)"]
    assert "role_moves" not in rows["taskplane-pd (2P:2D)"]  # the fixed row is what it always was
    for mode in ("auto", "lend"):
        row = rows[f"taskplane-pd (2P:2D, {mode} roles)"]
        assert row["calls"] > 0 and row["role_moves"] >= 0
        # dedicated prefill replicas, time-weighted: a lent one no longer counts
        floor = 1.0 if mode == "auto" else 0.0
        assert row["mean_prefill_replicas"] is not None and floor <= row["mean_prefill_replicas"] <= 2.0
