"""Gateway load benchmark: N concurrent streaming calls through a real gateway process to
simulated replicas on loopback, against the same calls sent straight to the replicas.

    python -m taskplane.bench.gateway_load --calls 1000 --replicas 4 --out gateway-load.json
    python -m taskplane.bench.gateway_load --calls 200 --data-planes envoy,python
    python -m taskplane.bench.gateway_load --calls 200 --replicas 3 --data-planes direct,envoy,python --rounds 4
    python -m taskplane.bench.gateway_load --calls 200 --replicas 3 --rounds 5   # median of 5 alternating pairs

With several data planes (``envoy``: Envoy + taskplane's endpoint picker, the default;
``python``: the thin Python proxy) each gets its own gateway over the same replicas, in
one run, after the direct phase. CPU is the gateway process and its children (Envoy).

Reports errors (non-200, or a stream that did not end with ``[DONE]``), the gateway's peak
RSS (psutil, sampled every 50 ms), and TTFT / total latency percentiles for both paths;
"added" is gateway minus direct at the same percentile. Each phase is bounded: it stops
when its calls are done or after ``--timeout-s``. Client, gateway and replicas share the
machine's cores, so the added latency includes CPU contention with the load generator.

``--postgres`` gives the gateways an embedded Postgres (as ``taskplane dev up`` does), so
their CPU includes the attempt rows' outbox and writer, and checks the rows afterwards:
one success row per call served, none doubled (``rows``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from taskplane.bench import envoy_stats, picker_timing
from taskplane.bench.live_stack import (
    RssSampler,
    count_rows,
    cpu_by_process,
    embedded_postgres,
    pin_ports,
    raise_fd_limit,
)
from taskplane.bench.load_client import PhaseStats, run_phase
from taskplane.bench.real_metrics import histograms
from taskplane.dev.local import LocalCluster
from taskplane.epp.gcfreeze import FREEZE_ENV
from taskplane.epp.timing import PROBE_ENV

QUEUE = "taskplane_gateway_queue_seconds"
#: Waited after a phase before reading the picker's metrics: Envoy flushes its access log every 50 ms.
LOG_FLUSH_S = 0.3
#: The picker's loop probe period for the bench's gateways (``taskplane.epp.timing``).
LOOP_PROBE_S = "0.005"
#: Every call of the bench comes from one tenant, allowed them all at once (``load_config``).
HEADERS = {"X-Taskplane-Tenant": "load"}


@dataclass(frozen=True, kw_only=True)
class LoadOptions:
    """One run of the bench (the command's flags; defaults as its)."""

    calls: int = 1000  # concurrent streaming calls per phase
    replicas: int = 4
    max_tokens: int = 32
    speed: float = 20.0  # the simulated replicas' speed-up over their GPU timing model
    timeout_s: float = 300.0  # bound on each phase
    admission: bool = True  # False: the admission queue off (proxy overhead only)
    data_planes: tuple[str, ...] = ("envoy",)  # each its own gateway over the same replicas (PLANES)
    postgres: bool = False  # an embedded Postgres for the gateways' attempt rows, then their count
    rounds: int = 1  # the direct phase and each plane's this many times, alternating


def load_config(calls: int, admission: bool = True) -> dict[str, Any]:
    """The gateway under load: one tenant allowed every call at once."""
    return {"tenants": [{"id": "load", "max_priority": "interactive", "max_concurrent": calls + 10}],
            "limits": {"request_timeout_s": 300.0}, "scheduler": {"admission": admission}}


async def gateway_phase(name: str, url: str, pid: int, options: LoadOptions, direct: PhaseStats) -> dict[str, Any]:
    """One data plane under the load: its latency, errors, CPU and memory against the direct phase."""
    urls = [f"{url}/v1/chat/completions"]
    calls = options.calls
    _, warm = await run_phase(f"warmup-{name}", urls, min(50, calls), options.max_tokens, options.timeout_s, HEADERS)
    sampler = RssSampler(pid)
    cpu0 = cpu_by_process(sampler.proc)
    queue0 = await _queue_seconds(url)
    admin = envoy_stats.admin_port(pid)
    timing0, upstream0 = await picker_timing.read(url), await envoy_stats.replica_counters(admin)
    with sampler:
        gateway, results = await run_phase(name, urls, calls, options.max_tokens, options.timeout_s, HEADERS)
    cpu1 = cpu_by_process(sampler.proc)
    split = {k: round((v - cpu0.get(k, 0.0)) * 1000.0 / calls, 3) for k, v in cpu1.items()}
    cpu_s = sum(cpu1.values()) - sum(cpu0.values())
    await asyncio.sleep(LOG_FLUSH_S)  # the last streams' access-log entries (Envoy flushes every 50 ms)
    queue1 = await _queue_seconds(url)
    timing1, upstream1 = await picker_timing.read(url), await envoy_stats.replica_counters(admin)
    added, ratio = against_direct(gateway, direct)
    refusals = sum(1 for e in gateway.error_samples if e.startswith(("429", "503")))
    return {
        "stats": asdict(gateway), "errors": gateway.errors, "refusal_samples": refusals,
        # the warm-up's calls write rows too: its errors are reported, not only the phase's
        "warmup_errors": sum(1 for r in warm if not r.ok),
        "warmup_error_samples": sorted({f"{r.status}: {r.error}" for r in warm if not r.ok})[:5],
        "served": sum(1 for r in warm if r.ok) + sum(1 for r in results if r.ok),
        "rss_mb": {"before": round(sampler.baseline / 2**20, 1), "peak": round(sampler.peak / 2**20, 1)},
        "cpu_ms_per_call": round(cpu_s * 1000.0 / calls, 3), "cpu_ms_per_call_by_process": split,
        "admission_wait_ms_mean": round((queue1[0] - queue0[0]) * 1000.0 / max(1.0, queue1[1] - queue0[1]), 1),
        "added_ms": added, "ratio_to_direct": ratio,
        # where the first token waited: the picker's decision, Envoy's clock per call, the loop's lag
        "picker_ms": picker_timing.phase_figures(timing0, timing1),
        # why tries failed: Envoy's replica-cluster counters that moved during the phase
        "envoy_upstream": envoy_stats.moved(upstream0, upstream1),
    }


def against_direct(gateway: PhaseStats, direct: PhaseStats) -> tuple[dict[str, Any], dict[str, Any]]:
    """The milliseconds a data plane added to the direct phase's TTFT and total, and its ratios."""
    added = {
        kind: {p: round(getattr(gateway, kind)[p] - getattr(direct, kind)[p], 1) for p in ("p50", "p90", "p99")
               if p in getattr(gateway, kind) and p in getattr(direct, kind)}
        for kind in ("ttft_ms", "total_ms")
    }
    ratio = {kind: {p: round(getattr(gateway, kind)[p] / getattr(direct, kind)[p], 3) for p in ("p50", "p99")
                    if getattr(direct, kind).get(p) and p in getattr(gateway, kind)}
             for kind in ("ttft_ms", "total_ms")}
    return added, ratio


def median_ratios(rounds: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per data plane, the median over rounds of each round's ratio to that round's direct
    phase: on a shared machine the load moves between phases, so one pair is not a figure."""
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for r in rounds:
        for plane, kinds in r["ratio_to_direct"].items():
            for kind, qs in kinds.items():
                for q, ratio in qs.items():
                    out.setdefault(plane, {}).setdefault(kind, {}).setdefault(q, []).append(ratio)
    return {plane: {kind: {q: round(statistics.median(v), 3) for q, v in qs.items()} for kind, qs in kinds.items()}
            for plane, kinds in out.items()}


async def bench(cluster: LocalCluster, options: LoadOptions, gateways: dict[str, tuple[str, int]]) -> dict[str, Any]:
    """``options.rounds`` times: the direct phase, then each data plane's (in reverse order every
    other round, so no plane always runs right after direct); the first round's figures in
    full, every round's ratios, and their medians."""
    calls, max_tokens, timeout_s = options.calls, options.max_tokens, options.timeout_s
    direct_urls = [f"{r.url}/v1/chat/completions" for r in cluster.replicas]
    # warm the direct path (connections, first-call imports), then measure
    await run_phase("warmup-direct", direct_urls, min(50, calls), max_tokens, timeout_s, HEADERS)
    per_round: list[dict[str, Any]] = []
    served = 0  # every round's, warm-ups included: what the rows in Postgres are counted against
    for i in range(options.rounds):
        round_direct, _ = await run_phase("direct", direct_urls, calls, max_tokens, timeout_s, HEADERS)
        order = list(gateways.items())[::-1 if i % 2 else 1]
        ran = {name: await gateway_phase(name, url, pid, options, round_direct) for name, (url, pid) in order}
        round_planes = {name: ran[name] for name in gateways}
        served += sum(p["served"] for p in round_planes.values())
        if i == 0:
            direct, planes = round_direct, round_planes
        per_round.append(round_figures(round_direct, round_planes))
    first = next(iter(planes.values()))
    return {
        "rounds": per_round, "ratio_to_direct_median": median_ratios(per_round), "served": served,
        "warmup_errors": {k: sum(r["warmup_errors"][k] for r in per_round) for k in gateways},
        "calls": calls, "concurrency": calls, "replicas": len(cluster.replicas), "max_tokens": max_tokens,
        "cpu_count": psutil.cpu_count(),
        "errors": {"direct": direct.errors, "gateway": first["errors"]},  # the first data plane's (each: data_planes)
        "load_average_1m": round(os.getloadavg()[0], 2),
        "direct": asdict(direct), "data_planes": planes,
        # the first data plane under the keys earlier runs reported
        "gateway": first["stats"], "added_ms": first["added_ms"], "gateway_rss_mb": first["rss_mb"],
        "gateway_cpu_ms_per_call": first["cpu_ms_per_call"], "admission_wait_ms_mean": first["admission_wait_ms_mean"],
    }


def round_figures(direct: PhaseStats, planes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One round's figures: errors, the direct TTFT, each plane's CPU, ratios and picker timing."""
    return {
        "load_average_1m": round(os.getloadavg()[0], 2),
        "errors": {"direct": direct.errors, **{k: p["errors"] for k, p in planes.items()}},
        "warmup_errors": {k: p["warmup_errors"] for k, p in planes.items()},
        "direct_ttft_ms": {q: round(direct.ttft_ms.get(q, float("nan")), 1) for q in ("p50", "p99")},
        "client_ms": {"direct": direct.client_ms, **{k: p["stats"]["client_ms"] for k, p in planes.items()}},
        "cpu_ms_per_call": {k: p["cpu_ms_per_call"] for k, p in planes.items()},
        "ratio_to_direct": {k: p["ratio_to_direct"] for k, p in planes.items()},
        "picker_ms": {k: p["picker_ms"] for k, p in planes.items()},
        "envoy_upstream": {k: p["envoy_upstream"] for k, p in planes.items()},
    }


async def _queue_seconds(gateway_url: str) -> tuple[float, float]:
    """(sum, count) of the gateway's admission-queue histogram."""
    async with httpx.AsyncClient(trust_env=False) as client:
        text = (await client.get(f"{gateway_url}/metrics")).text
    queue = histograms(text, [QUEUE])[QUEUE]
    return queue.sum, queue.count


#: Each data plane the bench can run, by its ``TASKPLANE_DATA_PLANE``.
PLANES: dict[str, str] = {
    "envoy": "envoy",  # Envoy + the picker as ``taskplane gateway`` runs them
    "envoy-no-freeze": "envoy",  # the same, Python's collector left as it is (no gc.freeze at start-up)
    "python": "python",  # the thin Python proxy
}
#: Planes whose front door leaves Python's collector as it is (``taskplane.epp.gcfreeze``).
NO_FREEZE = ("envoy-no-freeze",)


def _use_plane(plane: str) -> None:
    os.environ["TASKPLANE_DATA_PLANE"] = PLANES[plane]
    os.environ[FREEZE_ENV] = "0" if plane in NO_FREEZE else "1"


def run(options: LoadOptions, *, workdir: Path | None = None) -> dict[str, Any]:
    """Start replicas + one gateway per data plane, run the phases, stop everything; return the figures."""
    raise_fd_limit(4 * options.calls + 1024)  # inherited by the gateway and replicas started below
    data_planes = tuple(p for p in options.data_planes if p != "direct") or ("envoy",)  # direct always runs
    unknown = [p for p in data_planes if p not in PLANES]
    if unknown:
        raise ValueError(f"unknown data plane(s) {unknown}: choose from direct, {', '.join(PLANES)}")
    saved = os.environ.get("TASKPLANE_DATA_PLANE")
    os.environ.setdefault(PROBE_ENV, LOOP_PROBE_S)  # inherited by the gateways started below
    with tempfile.TemporaryDirectory(prefix="tp-gw-load-") as tmp, contextlib.ExitStack() as stack:
        wd = workdir or Path(tmp)
        database_url = stack.enter_context(embedded_postgres(wd)) if options.postgres else None
        cluster = pin_ports(LocalCluster(wd, replicas=options.replicas, speed=options.speed, kv_blocks=8192,
                                         database_url=database_url,
                                         config_overrides=load_config(options.calls, options.admission)))
        try:
            _use_plane(data_planes[0])
            with cluster:
                assert cluster.gateway_pid is not None
                gateways = {data_planes[0]: (cluster.gateway_url, cluster.gateway_pid)}
                for plane in data_planes[1:]:
                    _use_plane(plane)
                    gateways[plane] = cluster.add_gateway()
                res = asyncio.run(bench(cluster, options, gateways))
                res["admission"] = options.admission
            if database_url is not None:  # the gateways stopped: their writers flushed
                res["rows"] = asyncio.run(count_rows(database_url))
                res["rows"]["served"] = res["served"]  # all rounds, warm-ups included (as the rows)
            return res
        finally:
            os.environ.pop(FREEZE_ENV, None)
            if saved is None:
                os.environ.pop("TASKPLANE_DATA_PLANE", None)
            else:
                os.environ["TASKPLANE_DATA_PLANE"] = saved


def render(res: dict[str, Any]) -> str:
    d = res["direct"]
    lines = [
        f"{res['calls']} concurrent streaming calls, {res['replicas']} simulated replicas, max_tokens {res['max_tokens']}, "
        f"{res['cpu_count']} CPUs shared by client, gateway and replicas; load average {res['load_average_1m']}",
        f"errors: direct {res['errors']['direct']}, " + ", ".join(f"{k} {p['errors']}" for k, p in res["data_planes"].items())
        + "; in the data planes' warm-ups (all rounds): " + ", ".join(f"{k} {n}" for k, n in res["warmup_errors"].items()),
    ]
    for name, p in res["data_planes"].items():
        lines.append(f"{name}: RSS {p['rss_mb']['before']} MB before, peak {p['rss_mb']['peak']} MB; "
                     f"CPU {p['cpu_ms_per_call']} ms per call {p['cpu_ms_per_call_by_process']}; "
                     f"mean admission wait {p['admission_wait_ms_mean']} ms; TTFT ratio to direct {p['ratio_to_direct']['ttft_ms']}")
    for name, p in res["data_planes"].items():
        if p.get("picker_ms"):
            lines.append(f"{name} first-token path (p50 / p99 ms): " + "; ".join(
                f"{k} {v.get('p50', float('nan')):.1f} / {v.get('p99', float('nan')):.1f}" for k, v in p["picker_ms"].items()))
        if p.get("envoy_upstream"):
            lines.append(f"{name} Envoy replica-cluster counters moved: {p['envoy_upstream']}")
    clients = [("direct", d), *((k, p["stats"]) for k, p in res["data_planes"].items())]
    for name, st in clients:
        if st.get("client_ms"):
            lines.append(f"{name} client clock (p50 / p99 ms): " + "; ".join(
                f"{k} {v.get('p50', float('nan')):.1f} / {v.get('p99', float('nan')):.1f}" for k, v in st["client_ms"].items()))
    lines.append(f"{'':16}{'p50':>10}{'p90':>10}{'p99':>10}  (ms)")
    rows = [("TTFT direct", d, "ttft_ms"), ("total direct", d, "total_ms")]
    for name, p in res["data_planes"].items():
        rows += [(f"TTFT {name}", p["stats"], "ttft_ms"), (f"total {name}", p["stats"], "total_ms")]
    for label, stats, kind in rows:
        lines.append(f"{label:16}" + "".join(f"{stats[kind].get(q, float('nan')):>10.1f}" for q in ("p50", "p90", "p99")))
    if len(res["rounds"]) > 1:
        for i, r in enumerate(res["rounds"], 1):
            lines.append(f"round {i} (load {r['load_average_1m']}): direct TTFT {r['direct_ttft_ms']} ms; "
                         + "; ".join(f"{k} TTFT ratio {v['ttft_ms']}, CPU {r['cpu_ms_per_call'][k]} ms/call"
                                     for k, v in r["ratio_to_direct"].items()))
            for k, figs in r.get("picker_ms", {}).items():
                lines.append(f"  {k}: " + "; ".join(f"{n} p50 {v.get('p50', float('nan')):.1f} p99 {v.get('p99', float('nan')):.1f}"
                                                    for n, v in figs.items())
                             + (f"; Envoy {r['envoy_upstream'][k]}" if r.get("envoy_upstream", {}).get(k) else ""))
        lines.append("median over rounds: " + "; ".join(f"{k} TTFT ratio {v['ttft_ms']}"
                                                         for k, v in res["ratio_to_direct_median"].items()))
    if "rows" in res:
        lines.append(f"attempt rows in Postgres: {res['rows']}")
    samples = d["error_samples"] + [e for p in res["data_planes"].values()
                                    for e in p["stats"]["error_samples"] + p["warmup_error_samples"]]
    if samples:
        lines.append(f"error samples: {samples}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m taskplane.bench.gateway_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1000, help="concurrent streaming calls per phase")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--speed", type=float, default=20.0, help="sim speed-up over its GPU timing model")
    p.add_argument("--timeout-s", type=float, default=300.0, help="bound on each phase")
    p.add_argument("--no-admission", action="store_true", help="turn the admission queue off (proxy overhead only)")
    p.add_argument("--data-planes", default="envoy",
                   help="comma-separated: envoy (Envoy + picker: one picker message per stream, the Lua usage scan), "
                        "envoy-no-freeze (the same without gc.freeze at start-up), python (the thin proxy); "
                        "direct (always run) may be named too")
    p.add_argument("--postgres", action="store_true",
                   help="an embedded Postgres for the gateways' attempt rows (their CPU then includes the cost writer)")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat the direct phase and each data plane's this many times, alternating; report every "
                        "round's ratio to its own direct phase and the median (the load of a shared machine drifts)")
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = p.parse_args(argv)
    planes = tuple(x.strip() for x in args.data_planes.split(",") if x.strip())
    res = run(LoadOptions(calls=args.calls, replicas=args.replicas, max_tokens=args.max_tokens, speed=args.speed,
                          timeout_s=args.timeout_s, admission=not args.no_admission, data_planes=planes,
                          postgres=args.postgres, rounds=max(1, args.rounds)))
    print(render(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=2))
    failed = sum(n for r in res["rounds"] for n in r["errors"].values())
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
