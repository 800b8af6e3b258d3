"""``taskplane bench --pd P:D``: disaggregated fleets beside the aggregated fleet, one run.

The aggregated fleet is P+D H100 replicas placed by the best aggregated baseline
(``llm-d-scorers``) and ``taskplane``; the disaggregated fleet is the same GPUs as P
prefill-role and D decode-role replicas, placed by ``llm-d-pd``, ``dynamo-disagg`` and
``taskplane-pd``. Every run is the same workload and seed in
:class:`~taskplane.sim.pd_cluster.DisaggSim`. ``--load`` factors (default 1.0,1.3) scale the agent mix's
arrival rate from the aggregated fleet's measured capacity, as the policy comparison does.
``--pd-roles auto`` runs the disaggregated policies with the role planner
(:class:`~taskplane.autoscale.roles.RolePlanner`: the P:D split is where they start, and
replicas move between prefill and decode as the load asks); ``fixed,auto`` runs both.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from taskplane.autoscale.roles import RolePlanner, RolePlannerConfig
from taskplane.bench.options import BenchOptions
from taskplane.bench.suite import agent_points, fleet_capacity, preset_factories
from taskplane.bench.workloads import agent_tenants, mooncake_workload
from taskplane.errors import UserError
from taskplane.sim.cluster import ClusterSpec, ReplicaSpec
from taskplane.sim.pd_cluster import simulate_pd
from taskplane.sim.results import ClusterResult
from taskplane.sim.workloads.base import Workload
from taskplane.store.records import Outcome, TaskStatus

AGGREGATED = ("llm-d-scorers", "taskplane")
DISAGGREGATED = ("llm-d-pd", "dynamo-disagg", "taskplane-pd")
#: ``--pd-roles``: the split as given, the role planner, the role planner lending an idle prefill replica
ROLE_MODES = ("fixed", "auto", "lend")


def parse_roles(spec: str) -> list[str]:
    """``--pd-roles``: any of ``fixed``, ``auto``, ``lend``, comma-separated (run in that order)."""
    modes = [m.strip() for m in spec.split(",") if m.strip()]
    if not modes or any(m not in ROLE_MODES for m in modes):
        raise UserError(f"--pd-roles takes fixed, auto, lend or a comma-separated mix, got {spec!r}")
    return [m for m in ROLE_MODES if m in modes]


def role_planner(mode: str) -> RolePlanner:
    """The planner of a ``--pd-roles`` mode other than ``fixed``."""
    return RolePlanner(RolePlannerConfig(lend_idle_prefill=mode == "lend"))


def parse_pd(spec: str) -> tuple[int, int]:
    """``"2:6"`` -> (2, 6)."""
    p, _, d = spec.partition(":")
    try:
        n_p, n_d = int(p), int(d)
    except ValueError:
        raise UserError(f"--pd takes P:D (prefill and decode replicas), got {spec!r}") from None
    if n_p < 1 or n_d < 1:
        raise UserError("--pd needs at least one prefill and one decode replica")
    return n_p, n_d


def pd_fleet(n_p: int, n_d: int) -> ClusterSpec:
    return ClusterSpec([ReplicaSpec(f"prefill-{i}", role="prefill") for i in range(n_p)]
                       + [ReplicaSpec(f"decode-{i}", role="decode") for i in range(n_d)])


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


def pd_metrics(res: ClusterResult) -> dict[str, Any]:
    """TTFT p50/p99, ITL p99 (ms), tasks within deadline, $ per successful task, split share."""
    ok = [c for c in res.calls if c.outcome == Outcome.SUCCESS]
    ttft = [c.ttft_s * 1000.0 for c in ok if c.ttft_s is not None]
    itl = [c.itl_s * 1000.0 for c in ok if c.itl_s is not None]
    split = [c for c in ok if c.prefill_replica is not None]
    done = [t for t in res.tasks if t.status == TaskStatus.SUCCEEDED]
    cost = sum(c.cost_usd for c in res.calls)
    return {
        "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99), "itl_p99_ms": pct(itl, 99),
        "within_deadline": round(sum(1 for t in res.tasks if t.deadline_met) / max(len(res.tasks), 1), 4),
        "usd_per_success": round(cost / len(done), 6) if done else None,
        "disaggregated": round(len(split) / max(len(ok), 1), 3),
        "transfer_ms_mean": round(float(np.mean([c.transfer_ms for c in split])), 2) if split else 0.0,
        "calls": len(res.calls),
    }


def role_metrics(res: ClusterResult) -> dict[str, Any]:
    """A role-planned run's moves and its time-weighted prefill-role replicas."""
    return {"role_moves": len(res.role_moves), "mean_prefill_replicas": res.mean_prefill_replicas}


def _point(workload: Workload, n_p: int, n_d: int, seed: int, names: list[str],
           roles: tuple[str, ...] = ("fixed",)) -> dict[str, dict[str, Any]]:
    aggregated = ClusterSpec.fleet(f"h100:{n_p + n_d}")
    factories = preset_factories(names, seed, agent_tenants())
    out: dict[str, dict[str, Any]] = {}
    for name, make in factories.items():
        if name not in DISAGGREGATED:
            out[name] = pd_metrics(simulate_pd(aggregated, workload, make(), seed=seed))
            continue
        for mode in roles:  # a fresh fleet per run: the planner relabels its replicas
            if mode == "fixed":
                out[f"{name} ({n_p}P:{n_d}D)"] = pd_metrics(simulate_pd(pd_fleet(n_p, n_d), workload, make(), seed=seed))
                continue
            res = simulate_pd(pd_fleet(n_p, n_d), workload, make(), seed=seed, roles=role_planner(mode))
            out[f"{name} ({n_p}P:{n_d}D, {mode} roles)"] = {**pd_metrics(res), **role_metrics(res)}
    return out


def run_pd(options: BenchOptions) -> dict[str, Any]:
    """Aggregated and disaggregated policies side by side on one workload (agents or mooncake)."""
    if options.workload not in ("agents", "mooncake") or options.engine != "sim":
        raise UserError("--pd runs --workload agents|mooncake in the simulator (--engine sim)")
    assert options.pd is not None
    n_p, n_d = parse_pd(options.pd)
    roles = tuple(parse_roles(options.pd_roles))
    names = [*AGGREGATED, *DISAGGREGATED] if options.policies is None else options.policies.split(",")
    points: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if options.workload == "mooncake":
        wl = mooncake_workload(options.trace, time_scale=options.time_scale, duration_s=options.duration_s)
        points["trace"] = _point(wl, n_p, n_d, options.seed, names, roles)
    else:  # loads relative to the aggregated fleet's measured capacity, as the policy comparison's
        fleet = f"h100:{n_p + n_d}"
        capacity = fleet_capacity(options, ClusterSpec.fleet(fleet), fleet, console=Console(),
                                  cache=options.out / "capacity.json")
        sweep, _ = agent_points(dataclasses.replace(options, load=options.load or "1.0,1.3"), capacity)
        for pt in sweep:
            points[f"{pt.load}x"] = _point(pt.workload, n_p, n_d, options.seed, names, roles)
        extra = {"capacity_tasks_per_s": round(capacity.tasks_per_s, 4)}
    results = {"workload": options.workload, "pd": options.pd, "pd_roles": list(roles), "seed": options.seed, **extra,
               "points": points}
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "results.json").write_text(json.dumps(results, indent=2))
    console = Console(width=180)
    for key, rows in points.items():
        table = Table(title=f"{options.workload} {key}: {n_p + n_d} H100 aggregated vs {n_p}P:{n_d}D")
        cols = list(dict.fromkeys(c for m in rows.values() for c in m))
        for c in ["policy", *cols]:
            table.add_column(c)
        for name, m in rows.items():
            table.add_row(name, *(str(m.get(c, "")) for c in cols))
        console.print(table)
    console.print(f"wrote {options.out / 'results.json'}")
    return results
