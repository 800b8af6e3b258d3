"""Gateway load benchmark: N concurrent streaming calls through a real gateway process to
simulated replicas on loopback, against the same calls sent straight to the replicas.

    python -m taskplane.bench.gateway_load --calls 1000 --replicas 4 --out gateway-load.json

Reports errors (non-200, or a stream that did not end with ``[DONE]``), the gateway's peak
RSS (psutil, sampled every 50 ms), and TTFT / total latency percentiles for both paths;
"added" is gateway minus direct at the same percentile. Each phase is bounded: it stops
when its calls are done or after ``--timeout-s``. Client, gateway and replicas share the
machine's cores, so the added latency includes CPU contention with the load generator.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from taskplane.bench.real_metrics import histograms
from taskplane.dev.local import LocalCluster

MODEL = "llama-3.1-8b"
QUEUE = "taskplane_gateway_queue_seconds"


@dataclass
class CallResult:
    ok: bool
    status: int
    ttft_s: float | None
    total_s: float
    error: str | None = None


@dataclass
class PhaseStats:
    name: str
    calls: int
    errors: int
    wall_s: float
    ttft_ms: dict[str, float] = field(default_factory=dict)
    total_ms: dict[str, float] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    xs = sorted(values)

    def q(p: float) -> float:
        return xs[min(len(xs) - 1, max(0, round(p * (len(xs) - 1))))] * 1000.0

    return {"p50": q(0.50), "p90": q(0.90), "p99": q(0.99), "max": xs[-1] * 1000.0, "mean": statistics.fmean(xs) * 1000.0}


def _body(i: int, max_tokens: int) -> dict[str, Any]:
    # distinct prompts (no prefix hits skewing one side), same on both paths
    return {"model": MODEL, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"load call {i}: summarise the state of ticket {i * 7919 % 100000}"}]}


async def one_call(client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]) -> CallResult:
    t0 = time.perf_counter()
    ttft: float | None = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode("utf-8", "replace")
                return CallResult(False, r.status_code, None, time.perf_counter() - t0, text[:200])
            done = False
            async for line in r.aiter_lines():
                if ttft is None and line.startswith("data: ") and '"content":"' in line.replace(" ", "") and '"content":""' not in line.replace(" ", ""):
                    ttft = time.perf_counter() - t0
                if line.strip() == "data: [DONE]":
                    done = True
                elif line.startswith("data: {\"error\""):
                    return CallResult(False, 200, ttft, time.perf_counter() - t0, line[:200])
            if not done:
                return CallResult(False, 200, ttft, time.perf_counter() - t0, "stream ended without [DONE]")
            return CallResult(True, 200, ttft, time.perf_counter() - t0)
    except (httpx.HTTPError, OSError) as exc:
        return CallResult(False, 0, ttft, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"[:200])


async def run_phase(name: str, urls: list[str], calls: int, max_tokens: int, timeout_s: float,
                    headers: dict[str, str]) -> tuple[PhaseStats, list[CallResult]]:
    # Several small client pools: httpcore scans a whole pool per request, which is quadratic
    # at a thousand streams and would make the load generator, not the gateway, the bottleneck.
    shards = max(1, calls // 50)
    per = calls // shards + 10
    limits = httpx.Limits(max_connections=per, max_keepalive_connections=per)
    timeout = httpx.Timeout(timeout_s, connect=30.0)
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False))
                   for _ in range(shards)]
        start = asyncio.Event()

        async def gated(i: int) -> CallResult:
            await start.wait()
            return await one_call(clients[i % shards], urls[i % len(urls)], _body(i, max_tokens), headers)

        tasks = [asyncio.ensure_future(gated(i)) for i in range(calls)]
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        start.set()  # all calls leave together: `calls` streams in flight at once
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for t in pending:
            t.cancel()
        wall = time.perf_counter() - t0
    results = [t.result() for t in done if not t.cancelled()]
    results += [CallResult(False, 0, None, wall, "did not finish within the phase timeout") for _ in pending]
    errors = [r for r in results if not r.ok]
    stats = PhaseStats(
        name=name, calls=calls, errors=len(errors), wall_s=wall,
        ttft_ms=percentiles([r.ttft_s for r in results if r.ok and r.ttft_s is not None]),
        total_ms=percentiles([r.total_s for r in results if r.ok]),
        error_samples=sorted({f"{r.status}: {r.error}" for r in errors})[:5],
    )
    return stats, results


class RssSampler:
    """Peak resident memory of a process (and its children) while a phase runs."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        self.proc = psutil.Process(pid)
        self.interval_s = interval_s
        self.peak = 0
        self.baseline = self._rss()
        self._task: asyncio.Task[None] | None = None

    def _rss(self) -> int:
        try:
            procs = [self.proc, *self.proc.children(recursive=True)]
            return sum(p.memory_info().rss for p in procs)
        except psutil.Error:
            return 0

    async def _loop(self) -> None:
        while True:
            self.peak = max(self.peak, self._rss())
            await asyncio.sleep(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.ensure_future(self._loop())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()
        self.peak = max(self.peak, self._rss())


def stable_port(low: int = 20000, high: int = 31000) -> int:
    """A free port below the kernel's ephemeral range (32768+ by default): a port picked by
    binding port 0 can be taken by one of the thousands of outgoing connections a load run
    opens before the server binds it."""
    import random
    import socket

    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # the sim's replay port (+1000) too
            try:
                s.bind(("127.0.0.1", port + 1000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port found below the ephemeral range")


def pin_ports(cluster: LocalCluster) -> LocalCluster:
    """Move a LocalCluster's ports out of the ephemeral range (see ``stable_port``)."""
    for r in cluster.replicas:
        r.port, r.kv_port = stable_port(), stable_port()
    cluster.gateway_port = stable_port()
    return cluster


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, need)) if hard != resource.RLIM_INFINITY else max(soft, need)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def load_config(calls: int, admission: bool = True) -> dict[str, Any]:
    """The gateway under load: one tenant allowed every call at once."""
    return {"tenants": [{"id": "load", "max_priority": "interactive", "max_concurrent": calls + 10}],
            "limits": {"request_timeout_s": 300.0}, "scheduler": {"admission": admission}}


async def bench(cluster: LocalCluster, calls: int, max_tokens: int, timeout_s: float) -> dict[str, Any]:
    headers = {"X-Taskplane-Tenant": "load"}
    direct_urls = [f"{r.url}/v1/chat/completions" for r in cluster.replicas]
    gw_urls = [f"{cluster.gateway_url}/v1/chat/completions"]
    assert cluster.gateway_pid is not None
    # warm both paths (connections, first-call imports), then measure
    await run_phase("warmup-direct", direct_urls, min(50, calls), max_tokens, timeout_s, headers)
    await run_phase("warmup-gateway", gw_urls, min(50, calls), max_tokens, timeout_s, headers)
    direct, _ = await run_phase("direct", direct_urls, calls, max_tokens, timeout_s, headers)
    sampler = RssSampler(cluster.gateway_pid)
    cpu0 = sampler.proc.cpu_times()
    queue0 = await _queue_seconds(cluster.gateway_url)
    with sampler:
        gateway, _ = await run_phase("gateway", gw_urls, calls, max_tokens, timeout_s, headers)
    cpu1 = sampler.proc.cpu_times()
    queue1 = await _queue_seconds(cluster.gateway_url)
    cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    added = {
        kind: {p: round(getattr(gateway, kind)[p] - getattr(direct, kind)[p], 1) for p in ("p50", "p90", "p99")
               if p in getattr(gateway, kind) and p in getattr(direct, kind)}
        for kind in ("ttft_ms", "total_ms")
    }
    return {
        "calls": calls, "concurrency": calls, "replicas": len(cluster.replicas), "max_tokens": max_tokens,
        "cpu_count": psutil.cpu_count(), "errors": {"direct": direct.errors, "gateway": gateway.errors},
        "gateway_rss_mb": {"before": round(sampler.baseline / 2**20, 1), "peak": round(sampler.peak / 2**20, 1)},
        "gateway_cpu_ms_per_call": round(cpu_s * 1000.0 / calls, 2),
        "admission_wait_ms_mean": round((queue1[0] - queue0[0]) * 1000.0 / max(1.0, queue1[1] - queue0[1]), 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "direct": asdict(direct), "gateway": asdict(gateway), "added_ms": added,
    }


async def _queue_seconds(gateway_url: str) -> tuple[float, float]:
    """(sum, count) of the gateway's admission-queue histogram."""
    async with httpx.AsyncClient(trust_env=False) as client:
        text = (await client.get(f"{gateway_url}/metrics")).text
    queue = histograms(text, [QUEUE])[QUEUE]
    return queue.sum, queue.count


def run(calls: int = 1000, replicas: int = 4, max_tokens: int = 32, speed: float = 20.0, timeout_s: float = 300.0,
        workdir: Path | None = None, admission: bool = True) -> dict[str, Any]:
    """Start replicas + gateway, run both phases, stop everything; return the figures."""
    _raise_fd_limit(4 * calls + 1024)  # inherited by the gateway and replicas started below
    with tempfile.TemporaryDirectory(prefix="tp-gw-load-") as tmp:
        wd = workdir or Path(tmp)
        cluster = pin_ports(LocalCluster(wd, replicas=replicas, speed=speed, kv_blocks=8192,
                                         config_overrides=load_config(calls, admission)))
        with cluster:
            res = asyncio.run(bench(cluster, calls, max_tokens, timeout_s))
            res["admission"] = admission
            return res


def render(res: dict[str, Any]) -> str:
    d, g, a = res["direct"], res["gateway"], res["added_ms"]
    lines = [
        f"{res['calls']} concurrent streaming calls, {res['replicas']} simulated replicas, max_tokens {res['max_tokens']}, "
        f"{res['cpu_count']} CPUs shared by client, gateway and replicas",
        f"errors: direct {res['errors']['direct']}, gateway {res['errors']['gateway']}",
        f"gateway RSS: {res['gateway_rss_mb']['before']} MB before, peak {res['gateway_rss_mb']['peak']} MB under load; "
        f"gateway CPU {res['gateway_cpu_ms_per_call']} ms per call; mean admission wait {res['admission_wait_ms_mean']} ms; "
        f"load average {res['load_average_1m']}",
        f"{'':14}{'p50':>10}{'p90':>10}{'p99':>10}  (ms)",
    ]
    for label, stats, kind in (("TTFT direct", d, "ttft_ms"), ("TTFT gateway", g, "ttft_ms"),
                               ("total direct", d, "total_ms"), ("total gateway", g, "total_ms")):
        lines.append(f"{label:14}" + "".join(f"{stats[kind].get(p, float('nan')):>10.1f}" for p in ("p50", "p90", "p99")))
    for kind, label in (("ttft_ms", "TTFT added"), ("total_ms", "total added")):
        lines.append(f"{label:14}" + "".join(f"{a[kind].get(p, float('nan')):>10.1f}" for p in ("p50", "p90", "p99")))
    if res["gateway"]["error_samples"] or res["direct"]["error_samples"]:
        lines.append(f"error samples: {res['direct']['error_samples'] + res['gateway']['error_samples']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m taskplane.bench.gateway_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1000, help="concurrent streaming calls per phase")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--speed", type=float, default=20.0, help="sim speed-up over its GPU timing model")
    p.add_argument("--timeout-s", type=float, default=300.0, help="bound on each phase")
    p.add_argument("--no-admission", action="store_true", help="turn the admission queue off (proxy overhead only)")
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = p.parse_args(argv)
    res = run(args.calls, args.replicas, args.max_tokens, args.speed, args.timeout_s, admission=not args.no_admission)
    print(render(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=2))
    return 0 if res["errors"]["gateway"] == 0 and res["errors"]["direct"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
