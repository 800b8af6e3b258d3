"""A disaggregated fleet whose replicas change role mid-run (the role planner in DisaggSim)."""

from __future__ import annotations

from taskplane.autoscale.roles import RolePlanner, RolePlannerConfig
from taskplane.bench.workloads import agent_tenants, agent_workload
from taskplane.scheduler.policies import build_policy
from taskplane.sim.cluster import ClusterSpec, ReplicaSpec
from taskplane.sim.pd_cluster import simulate_pd
from taskplane.sim.results import ClusterResult
from taskplane.store.records import Outcome, TaskStatus


def _fleet(n_p: int, n_d: int) -> ClusterSpec:
    return ClusterSpec([ReplicaSpec(f"p-{i}", role="prefill") for i in range(n_p)]
                       + [ReplicaSpec(f"d-{i}", role="decode") for i in range(n_d)])


def _roles_at(res: ClusterResult, start: dict[str, str], t: float, *, inclusive: bool) -> dict[str, str]:
    roles = dict(start)
    for at, name, role in res.role_moves:
        if at < t or (inclusive and at == t):
            roles[name] = role
    return roles


def _assert_placements_follow_roles(res: ClusterResult, start: dict[str, str]) -> None:
    """Every call decoded on a replica that was not prefill-role when it was placed, and every
    prefill leg ran on one that was (a move at the placement's very instant counts either way)."""
    for c in res.calls:
        if c.dispatched_s is None or c.replica is None:
            continue
        ok = False
        for inclusive in (False, True):
            roles = _roles_at(res, start, c.dispatched_s, inclusive=inclusive)
            ok = ok or (roles[c.replica] != "prefill"
                        and (c.prefill_replica is None or roles[c.prefill_replica] == "prefill"))
        assert ok, c


def _assert_all_done(res: ClusterResult, n_calls: int) -> None:
    assert all(t.status == TaskStatus.SUCCEEDED for t in res.tasks)
    ok = [c for c in res.calls if c.outcome == Outcome.SUCCESS]
    assert len(ok) == n_calls
    assert all(c.cost_usd > 0 for c in ok)
    # a disaggregated call's record carries its prefill replica's share as well
    assert any(c.prefill_replica is not None for c in ok)


def test_prefill_backlog_takes_decode_replicas_and_every_call_completes() -> None:
    wl = agent_workload(40, 1.0, 1)
    # decode load never counts here (its targets are out of reach): only the prefill queue moves replicas
    cfg = RolePlannerConfig(interval_s=2.0, prefill_tokens_per_s=2_000.0, sustain=1, cooldown_s=4.0,
                            decode_target_seqs=1000.0, decode_target_kv=10.0)
    start = {"p-0": "prefill", "d-0": "decode", "d-1": "decode", "d-2": "decode"}
    # llm-d-pd sends every prompt to the one prefill replica: its queue grows
    res = simulate_pd(_fleet(1, 3), wl, build_policy("llm-d-pd", seed=1, tenants=agent_tenants()), seed=1,
                      roles=RolePlanner(cfg))
    assert any(role == "prefill" for _, _, role in res.role_moves)
    assert res.mean_prefill_replicas is not None and res.mean_prefill_replicas > 1.0
    assert sum(1 for c in res.calls if c.prefill_replica not in (None, "p-0")) > 0  # a moved replica prefills
    _assert_placements_follow_roles(res, start)
    _assert_all_done(res, wl.num_calls)


def test_idle_prefill_replicas_move_to_decode_but_one_stays() -> None:
    wl = agent_workload(60, 2.0, 1)
    cfg = RolePlannerConfig(interval_s=2.0, sustain=1, cooldown_s=2.0, decode_target_seqs=4.0, decode_low=0.1)
    start = {"p-0": "prefill", "p-1": "prefill", "p-2": "prefill", "d-0": "decode"}
    res = simulate_pd(_fleet(3, 1), wl, build_policy("taskplane-pd", seed=1, tenants=agent_tenants()), seed=1,
                      roles=RolePlanner(cfg))
    final = _roles_at(res, start, float("inf"), inclusive=True)
    assert sum(1 for r in final.values() if r == "decode") >= 2
    assert sum(1 for r in final.values() if r == "prefill") >= 1  # never below one per role
    assert any(c.replica in ("p-0", "p-1", "p-2") for c in res.calls)  # a moved replica decodes
    _assert_placements_follow_roles(res, start)
    assert all(t.status == TaskStatus.SUCCEEDED for t in res.tasks)
    assert all(c.cost_usd > 0 for c in res.calls if c.outcome == Outcome.SUCCESS)


def test_without_a_planner_nothing_moves() -> None:
    wl = agent_workload(10, 1.0, 1)
    res = simulate_pd(_fleet(1, 2), wl, build_policy("taskplane-pd", seed=1, tenants=agent_tenants()), seed=1)
    assert res.role_moves == [] and res.mean_prefill_replicas is None
