"""The taskplane preset with other load-balance filter parameters, side by side in one run.

    python -m benchmarks.load_balance_sweep mooncake [--duration-s S] [--host-kv-gb G] VARIANT...
    python -m benchmarks.load_balance_sweep agents --load L [--host-kv-gb G] [--seed N] VARIANT...

VARIANT: ``default`` (the preset as it is), ``none`` (no load-balance filter), a JSON object
of load-balance parameters (e.g. ``'{"chance_k": 0}'``),
``gate=off`` (the preset without the prefill gate, ``AdmissionSettings.serial_prefill``),
``drop=off`` (without its KV lifetimes: a replayed session's blocks are not dropped at its end),
``seventh=off`` (both ``gate=off`` and ``drop=off``),
``gatemin=N`` (the prefill gate holding only calls with at least N prompt tokens to
compute, ``AdmissionSettings.serial_prefill_min_tokens``), ``backlog=MS`` or ``backlog=off`` (the preset with ``AdmissionSettings.max_prefill_backlog_ms``
at MS, or None: late binding off), ``prefill=N[,slack=S][,wait=MS][,backlog=MS][,after]`` or ``prefill=off`` (the
preset with the ``prefill-finish`` filter at ``min_uncached_tokens`` N, or without it), or another preset's name (``llm-d-scorers``). Mooncake runs on 16 x H100, the agents on
4 x H100 at L times 0.835 tasks/s (the GPU-only capacity the agents bench measured; ``--replicas N``:
N x H100 at N / 4 times that).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from taskplane.bench.ceiling import hit_ceiling
from taskplane.bench.metrics import call_latencies, policy_metrics
from taskplane.bench.runner import run_policy
from taskplane.bench.suite import build_cluster, lifetimes_for
from taskplane.bench.tiers import tier_metrics
from taskplane.bench.workloads import (
    DEFAULT_WINDOW_S,
    agent_tenants,
    agent_workload,
    mooncake_workload,
    tasks_for,
)
from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.scheduler.policies import PRESETS, build_policy, build_scheduler
from taskplane.sim.hosttier import TierSpec

AGENTS_CAPACITY = 0.835  # tasks/s of h100:4 (llm-d-scorers at >= 90 % within deadline), docs/benchmarks.md


def policy(variant: str, seed: int, tenants: Any) -> tuple[Any, str]:
    if variant in ("gate=off", "drop=off", "seventh=off"):
        # the preset without the prefill gate, without its KV lifetimes (for a trace: no drop
        # at a session's end; the name is no preset's, so lifetimes_for gives none), or both
        settings = AdmissionSettings(serial_prefill=variant == "drop=off")
        return (build_policy("taskplane", seed=seed, tenants=tenants, metrics=False, admission=settings),
                "taskplane" if variant == "gate=off" else "taskplane-without-lifetimes")
    if variant in PRESETS:
        return build_policy(variant, seed=seed, tenants=tenants, metrics=False), variant
    if variant.startswith("gatemin="):
        settings = AdmissionSettings(serial_prefill_min_tokens=int(variant.removeprefix("gatemin=")))
        return build_policy("taskplane", seed=seed, tenants=tenants, metrics=False, admission=settings), "taskplane"
    if variant.startswith("backlog="):
        value = variant.removeprefix("backlog=")
        settings = AdmissionSettings(max_prefill_backlog_ms=None if value == "off" else float(value))
        return build_policy("taskplane", seed=seed, tenants=tenants, metrics=False, admission=settings), "taskplane"
    if variant.startswith("prefill="):
        return prefill_variant(variant.removeprefix("prefill="), seed, tenants), "taskplane"
    filters: list[Any] = [f for f in PRESETS["taskplane"].filters if f != "load-balance"]
    if variant == "default":
        filters.append("load-balance")
    elif variant != "none":
        filters.append({"type": "load-balance", "params": json.loads(variant)})
    return build_scheduler(policy="taskplane", filters=filters, seed=seed, tenants=tenants, metrics=False), "taskplane"


def prefill_variant(spec: str, seed: int, tenants: Any) -> Any:
    """``prefill=N[,slack=S][,wait=MS][,backlog=MS][,after]``: the taskplane preset with the ``prefill-finish`` filter
    at ``min_uncached_tokens`` N (``off``: without it), before the load-balance filter (``after``: behind it)."""
    head, *opts = spec.split(",")
    filters: list[Any] = [f for f in PRESETS["taskplane"].filters if f != "prefill-finish"]
    if head != "off":  # (``wait=off`` below: long prompts only)
        params: dict[str, Any] = {"min_uncached_tokens": int(head)}
        for o in opts:
            if o.startswith("slack="):
                params["slack"] = float(o.removeprefix("slack="))
            if o.startswith("wait="):
                value = o.removeprefix("wait=")
                params["max_wait_ms"] = None if value == "off" else float(value)
        at = len(filters) if "after" in opts else filters.index("load-balance")
        filters.insert(at, {"type": "prefill-finish", "params": params})
    backlog = next((o.removeprefix("backlog=") for o in opts if o.startswith("backlog=")), None)
    admission = None if backlog is None else AdmissionSettings(
        max_prefill_backlog_ms=None if backlog == "off" else float(backlog))
    return build_scheduler(policy="taskplane", filters=filters, seed=seed, tenants=tenants, metrics=False,
                           admission=admission)


def sweep_parser() -> argparse.ArgumentParser:
    """The workload, its options and the variants (shared with benchmarks/ttft_anatomy.py)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", choices=("mooncake", "agents"))
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--duration-s", type=float, default=None)
    ap.add_argument("--host-kv-gb", type=float, default=0.0)
    ap.add_argument("--load", type=float, default=1.3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replicas", type=int, default=4, help="agents: the fleet's H100s (the load scales with them)")
    ap.add_argument("--trace", type=Path, default=None, help="a trace in the Mooncake format (default: ../shared/traces/mooncake_conversation_trace.jsonl)")
    return ap


def sweep_setup(a: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(workload, tenants, cluster): a trace on 16 x H100, or the agent mix at ``--load`` on ``--replicas``."""
    if a.workload == "mooncake":
        wl, tenants = mooncake_workload(a.trace, duration_s=a.duration_s), None
        cluster, _ = build_cluster(16, None, TierSpec(host_kv_gb=a.host_kv_gb))
    else:
        rate = a.load * AGENTS_CAPACITY * a.replicas / 4
        wl, tenants = agent_workload(tasks_for(rate, DEFAULT_WINDOW_S), rate, a.seed), agent_tenants()
        cluster, _ = build_cluster(a.replicas, None, TierSpec(host_kv_gb=a.host_kv_gb))
    return wl, tenants, cluster


def main() -> None:
    a = sweep_parser().parse_args()
    wl, tenants, cluster = sweep_setup(a)
    ceiling = hit_ceiling(wl)
    for v in a.variants:
        pol, preset = policy(v, a.seed, tenants)
        run = run_policy(pol, wl, cluster, seed=a.seed, kv_lifetimes=lifetimes_for(preset))
        m = policy_metrics(run.result, hit_ceiling=ceiling, decision_ns=run.decision_ns,
                           latencies=call_latencies(run.result))
        m.update(tier_metrics(run.result, wl))
        line = (f"{v:26s} TTFT p50 {m['ttft_p50_ms']:6.0f} p99 {m['ttft_p99_ms']:7.0f} ms  "
                f"hits {m['prefix_hit_ratio']:.3f}")
        if a.workload == "agents":
            g, w = m["tool_gap_ttft_p99_ms"], m["warm_ttft_p99_ms"]
            line += (f"  in deadline {m['deadline_met_ratio']:.2%}  after a tool gap p99 {g:.0f} / warm p99 {w:.0f} ms"
                     f" = {g / w:.2f}x  sheds {m['sheds']}")
        print(f"{line}  cpu {run.cpu_s:.1f} s", flush=True)


if __name__ == "__main__":
    main()
