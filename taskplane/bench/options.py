"""What one ``taskplane bench`` run was asked for: every flag of the command, built once.

The command line builds a :class:`BenchOptions` and every workload's runner reads the
fields it needs from it, so a flag added to the command is added here and where it is
used, not to each function in between.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from taskplane.errors import UserError

WORKLOADS = ("agents", "mooncake")
#: every ``--workload``: the policy comparisons, then one policy at fleet scale, then the autoscalers,
#: then LoRA adapters placed by each policy, then two base models sharing the fleet
ALL_WORKLOADS = (*WORKLOADS, "scale", "diurnal", "adapters", "models")
DEFAULT_LOADS = (0.5, 1.0, 1.3)


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    """The flags of ``taskplane bench`` as given (defaults as the command's)."""

    out: Path  # directory for results.json, results.md and the plots
    workload: str = "agents"  # one of ALL_WORKLOADS
    trace: Path | None = None  # a Mooncake-format file (mooncake, diurnal)
    replicas: int = 16
    policies: str | None = None  # comma-separated preset (or router, or autoscaler) names; None: all
    seed: int = 1
    time_scale: float = 1.0  # arrival time factor (<1 compresses: more load)
    engine: str = "sim"  # sim (virtual time) or vllm (real replicas)
    tasks: int | None = None  # agent tasks (agents, scale)
    load: str | None = None  # comma-separated load factors of the agents sweep
    fleet: str | None = None  # a GPU mix, e.g. h100:8,l40s:8 (default: h100 x replicas)
    duration_s: float | None = None  # mooncake: the trace's first S seconds; agents: the arrival window
    cells: int = 1  # scale: split fleet and tasks into this many cells
    host_kv_gb: float = 0.0  # a host KV tier per replica (sim)
    remote_kv_gb: float = 0.0  # a remote KV store shared by the fleet (sim)
    hints: str = "author"  # the steps hints the simulated SDK sends: author, none, noisy, exact
    cold_start_s: float | None = None  # diurnal: provisioning to first placement (default: the GPU's)
    pd: str | None = None  # "P:D": disaggregated fleets beside the aggregated one (taskplane.bench.pd)
    pd_roles: str = "fixed"  # with pd: "fixed", "auto" (taskplane.autoscale.roles) or "fixed,auto"


def parse_policies(spec: str | None) -> list[str]:
    """``--policies`` as preset names, in order, without repeats (None, "" or "all": every preset)."""
    from taskplane.scheduler.policies import policy_names

    known = policy_names()
    if spec is None or spec.strip() in ("", "all"):
        return known
    names = [p.strip() for p in spec.split(",") if p.strip()]
    unknown = [p for p in names if p not in known]
    if unknown:
        raise UserError(f"unknown policy {', '.join(unknown)}; choose from {', '.join(known)} (or 'all')")
    return list(dict.fromkeys(names))


def parse_loads(spec: str | None) -> list[float]:
    """``--load`` as sorted distinct positive factors (None or "": the default sweep)."""
    if spec is None or not spec.strip():
        return list(DEFAULT_LOADS)
    try:
        loads = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--load takes comma-separated numbers like 0.5,1.0,1.3, got {spec!r}") from None
    if not loads or any(x <= 0 for x in loads):
        raise UserError(f"--load factors must be positive, got {spec!r}")
    return sorted(set(loads))
