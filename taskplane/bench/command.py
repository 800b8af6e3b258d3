"""``taskplane bench``: one entry for every workload, from the command's :class:`BenchOptions`.

``agents`` and ``mooncake`` compare placement policies side by side in the simulator
(:mod:`taskplane.bench.suite`) or, with ``--engine vllm``, routers on real replicas
(:mod:`taskplane.bench.real`); ``scale`` runs one policy at fleet scale
(:mod:`taskplane.bench.scale`); ``diurnal`` the autoscalers over a day
(:mod:`taskplane.bench.diurnal_command`); ``adapters`` LoRA tenants' agent sessions
(:mod:`taskplane.bench.adapters`); ``models`` two base models sharing a fleet
(:mod:`taskplane.bench.models`).
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from taskplane.bench.options import ALL_WORKLOADS, BenchOptions, parse_loads, parse_policies
from taskplane.bench.render import rich_table, write_results
from taskplane.bench.suite import build_cluster, preset_factories, run_suite, write_plots
from taskplane.bench.workloads import agent_tenants
from taskplane.errors import UserError
from taskplane.sim.hosttier import TierSpec


def run_bench(options: BenchOptions) -> dict[str, Any]:
    """The ``taskplane bench`` command (see the module docstring); returns results.json's content."""
    if options.workload not in ALL_WORKLOADS:
        raise UserError(f"--workload must be one of {', '.join(ALL_WORKLOADS)}, got {options.workload!r}")
    if options.pd is not None:
        from taskplane.bench.pd import run_pd

        return run_pd(options)
    if options.workload == "diurnal":
        from taskplane.bench.diurnal_command import run_diurnal_command

        return run_diurnal_command(options)
    if options.workload == "scale":
        return _run_scale(options)
    if options.workload == "adapters":
        from taskplane.bench.adapters import run_adapters

        return run_adapters(options)
    if options.workload == "models":
        from taskplane.bench.models import run_models

        return run_models(options)
    if options.cells != 1:
        raise UserError("--cells splits the fleet for --workload scale only")
    if options.engine == "vllm" and (options.host_kv_gb or options.remote_kv_gb):
        raise UserError("--host-kv-gb / --remote-kv-gb model KV tiers in the simulator: use them with --engine sim")
    if options.engine == "vllm":
        from taskplane.bench import real  # httpx, the vLLM launcher: only for --engine vllm

        return real.run_bench(options)
    if options.engine != "sim":
        raise UserError(f"--engine must be sim or vllm, got {options.engine!r}")
    return _run_comparison(options)


def _run_scale(options: BenchOptions) -> dict[str, Any]:
    """``--workload scale``: one policy at fleet scale (taskplane/bench/scale.py)."""
    from taskplane.bench.scale import ScaleRun, run_scale_command

    if options.engine != "sim":
        raise UserError("--workload scale runs in the cluster simulator: use --engine sim")
    names = parse_policies(options.policies) if options.policies else ["taskplane"]
    if len(names) != 1:
        raise UserError("--workload scale measures one policy: give --policies NAME")
    if options.tasks is not None and options.tasks < 1:
        raise UserError("--tasks must be at least 1")
    if not 1 <= options.cells <= options.replicas:
        raise UserError(f"--cells must be between 1 and --replicas ({options.replicas}), got {options.cells}")
    run = ScaleRun(replicas=options.replicas, tasks=options.tasks or 100_000, policy=names[0], seed=options.seed,
                   cells=options.cells)
    return run_scale_command(run, out=options.out)


def _check_comparison(options: BenchOptions) -> None:
    """The flags of a simulated policy comparison that no run could use."""
    if options.time_scale <= 0:
        raise UserError(f"--time-scale must be positive, got {options.time_scale}")
    if options.trace is not None and options.workload != "mooncake":
        raise UserError("--trace replays a Mooncake-format file: use it with --workload mooncake")
    if options.trace is not None and not options.trace.is_file():
        raise UserError(f"--trace {options.trace}: no such file")
    if options.tasks is not None and options.tasks < 1:
        raise UserError("--tasks must be at least 1")
    parse_policies(options.policies)
    if options.workload == "agents":
        parse_loads(options.load)
    if options.host_kv_gb < 0 or options.remote_kv_gb < 0:
        raise UserError("--host-kv-gb and --remote-kv-gb must be >= 0")


def _run_comparison(options: BenchOptions) -> dict[str, Any]:
    """``--workload agents|mooncake`` in the simulator: run, write results and plots, print the tables."""
    _check_comparison(options)
    tiers = TierSpec(host_kv_gb=options.host_kv_gb, remote_kv_gb=options.remote_kv_gb)
    cluster, fleet_spec = build_cluster(options.replicas, options.fleet, tiers, options.hints)
    tenants = agent_tenants() if options.workload == "agents" else None
    factories = preset_factories(parse_policies(options.policies), options.seed, tenants)

    console = Console()
    columns = (TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("calls"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        results, points = run_suite(options, cluster, fleet_spec, factories, progress=progress, console=console,
                                    capacity_cache=options.out / "capacity.json")
    results["command"] = "taskplane " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else ""
    json_path, md_path = write_results(options.out, results)
    pngs = write_plots(options.out, options.workload, points)

    for p in points:
        title = f"{options.workload} on {fleet_spec}" + (f" — load {p.load}x" if p.load is not None else "")
        console.print(rich_table(title, p.policies))
    for t in results["targets"]:
        mark = "[green]met[/]" if t["met"] else "[red]not met[/]"
        console.print(f"target: {t['target']}: ratio {t['ratio']} ({mark})")
    console.print(f"wrote {json_path}, {md_path}, " + ", ".join(str(p) for p in pngs))
    return results
