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
import itertools
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

from taskplane.bench import envoy_stats, picker_timing
from taskplane.bench.real_metrics import histograms
from taskplane.dev.local import LocalCluster
from taskplane.epp.gcfreeze import FREEZE_ENV
from taskplane.epp.timing import PROBE_ENV

MODEL = "llama-3.1-8b"
QUEUE = "taskplane_gateway_queue_seconds"
#: Waited after a phase before reading the picker's metrics: Envoy flushes its access log every 50 ms.
LOG_FLUSH_S = 0.3
#: The picker's loop probe period for the bench's gateways (``taskplane.epp.timing``).
LOOP_PROBE_S = "0.005"


@dataclass
class CallResult:
    ok: bool
    status: int
    ttft_s: float | None
    total_s: float
    error: str | None = None
    #: the client's own clock (httpx's trace events), seconds from the call's start: the TCP
    #: connection made (None: a pooled one), the request's last byte written, the response headers read
    client_s: dict[str, float] = field(default_factory=dict)


#: httpx trace events -> the client-side marks of a call (``CallResult.client_s``)
CLIENT_MARKS = {"connection.connect_tcp.complete": "connected", "http11.send_request_body.complete": "sent",
                "http11.receive_response_headers.complete": "headers"}


@dataclass
class PhaseStats:
    name: str
    calls: int
    errors: int
    wall_s: float
    ttft_ms: dict[str, float] = field(default_factory=dict)
    total_ms: dict[str, float] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)
    #: the client's clock per served call (``CLIENT_MARKS``): when it connected, had sent the
    #: request, had the response headers, had the first token; and between them (``*_to_*``)
    client_ms: dict[str, dict[str, float]] = field(default_factory=dict)


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
    marks: dict[str, float] = {}

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event in CLIENT_MARKS:
            marks[CLIENT_MARKS[event]] = time.perf_counter() - t0

    try:
        async with client.stream("POST", url, json=body, headers=headers, extensions={"trace": trace}) as r:
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
            if ttft is not None:
                marks["first_token"] = ttft
            return CallResult(True, 200, ttft, time.perf_counter() - t0, client_s=marks)
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
        client_ms=client_marks([r for r in results if r.ok]),
    )
    return stats, results


def client_marks(results: list[CallResult]) -> dict[str, dict[str, float]]:
    """Percentiles of each client-side mark, and of the time between consecutive ones:
    which part of a call's first token the client itself waited through."""
    out: dict[str, dict[str, float]] = {}
    order = ("sent", "headers", "first_token")
    for mark in ("connected", *order):
        values = [r.client_s[mark] for r in results if mark in r.client_s]
        if values:
            out[mark] = {k: round(v, 1) for k, v in percentiles(values).items()}
    for a, b in itertools.pairwise(order):
        gaps = [r.client_s[b] - r.client_s[a] for r in results if a in r.client_s and b in r.client_s]
        if gaps:
            out[f"{a}_to_{b}"] = {k: round(v, 1) for k, v in percentiles(gaps).items()}
    return out


def cpu_by_process(proc: psutil.Process) -> dict[str, float]:
    """User + system CPU seconds of a process (``gateway``: the picker and the HTTP app, or
    the Python proxy) and of its live children by name (``envoy`` under the front door)."""
    out: dict[str, float] = {}
    try:
        procs = [("gateway", proc), *((c.name(), c) for c in proc.children(recursive=True))]
    except psutil.Error:
        return out
    for name, p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[name] = out.get(name, 0.0) + t.user + t.system
    return out


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU of a process and its live children (Envoy under the front door)."""
    return sum(cpu_by_process(proc).values())


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


async def gateway_phase(name: str, url: str, pid: int, calls: int, max_tokens: int, timeout_s: float,
                        headers: dict[str, str], direct: PhaseStats) -> dict[str, Any]:
    """One data plane under the load: its latency, errors, CPU and memory against the direct phase."""
    urls = [f"{url}/v1/chat/completions"]
    _, warm = await run_phase(f"warmup-{name}", urls, min(50, calls), max_tokens, timeout_s, headers)
    sampler = RssSampler(pid)
    cpu0 = cpu_by_process(sampler.proc)
    queue0 = await _queue_seconds(url)
    admin = envoy_stats.admin_port(pid)
    timing0, upstream0 = await picker_timing.read(url), await envoy_stats.replica_counters(admin)
    with sampler:
        gateway, results = await run_phase(name, urls, calls, max_tokens, timeout_s, headers)
    cpu1 = cpu_by_process(sampler.proc)
    split = {k: round((v - cpu0.get(k, 0.0)) * 1000.0 / calls, 3) for k, v in cpu1.items()}
    cpu_s = sum(cpu1.values()) - sum(cpu0.values())
    await asyncio.sleep(LOG_FLUSH_S)  # the last streams' access-log entries (Envoy flushes every 50 ms)
    queue1 = await _queue_seconds(url)
    timing1, upstream1 = await picker_timing.read(url), await envoy_stats.replica_counters(admin)
    added = {
        kind: {p: round(getattr(gateway, kind)[p] - getattr(direct, kind)[p], 1) for p in ("p50", "p90", "p99")
               if p in getattr(gateway, kind) and p in getattr(direct, kind)}
        for kind in ("ttft_ms", "total_ms")
    }
    ratio = {kind: {p: round(getattr(gateway, kind)[p] / getattr(direct, kind)[p], 3) for p in ("p50", "p99")
                    if getattr(direct, kind).get(p) and p in getattr(gateway, kind)}
             for kind in ("ttft_ms", "total_ms")}
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


async def bench(cluster: LocalCluster, calls: int, max_tokens: int, timeout_s: float,
                gateways: dict[str, tuple[str, int]], rounds: int = 1) -> dict[str, Any]:
    """``rounds`` times: the direct phase, then each data plane's (in reverse order every
    other round, so no plane always runs right after direct); the first round's figures in
    full, every round's ratios, and their medians."""
    headers = {"X-Taskplane-Tenant": "load"}
    direct_urls = [f"{r.url}/v1/chat/completions" for r in cluster.replicas]
    # warm the direct path (connections, first-call imports), then measure
    await run_phase("warmup-direct", direct_urls, min(50, calls), max_tokens, timeout_s, headers)
    per_round: list[dict[str, Any]] = []
    served = 0  # every round's, warm-ups included: what the rows in Postgres are counted against
    for i in range(rounds):
        round_direct, _ = await run_phase("direct", direct_urls, calls, max_tokens, timeout_s, headers)
        order = list(gateways.items())[::-1 if i % 2 else 1]
        ran = {name: await gateway_phase(name, url, pid, calls, max_tokens, timeout_s, headers, round_direct)
               for name, (url, pid) in order}
        round_planes = {name: ran[name] for name in gateways}
        served += sum(p["served"] for p in round_planes.values())
        if i == 0:
            direct, planes = round_direct, round_planes
        per_round.append({
            "load_average_1m": round(os.getloadavg()[0], 2),
            "errors": {"direct": round_direct.errors, **{k: p["errors"] for k, p in round_planes.items()}},
            "warmup_errors": {k: p["warmup_errors"] for k, p in round_planes.items()},
            "direct_ttft_ms": {q: round(round_direct.ttft_ms.get(q, float("nan")), 1) for q in ("p50", "p99")},
            "client_ms": {"direct": round_direct.client_ms, **{k: p["stats"]["client_ms"] for k, p in round_planes.items()}},
            "cpu_ms_per_call": {k: p["cpu_ms_per_call"] for k, p in round_planes.items()},
            "ratio_to_direct": {k: p["ratio_to_direct"] for k, p in round_planes.items()},
            "picker_ms": {k: p["picker_ms"] for k, p in round_planes.items()},
            "envoy_upstream": {k: p["envoy_upstream"] for k, p in round_planes.items()},
        })
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


async def _queue_seconds(gateway_url: str) -> tuple[float, float]:
    """(sum, count) of the gateway's admission-queue histogram."""
    async with httpx.AsyncClient(trust_env=False) as client:
        text = (await client.get(f"{gateway_url}/metrics")).text
    queue = histograms(text, [QUEUE])[QUEUE]
    return queue.sum, queue.count


async def count_rows(database_url: str) -> dict[str, Any]:
    """Attempt rows by outcome, how many call keys have more than one success row, and the
    other rows by outcome and error type."""
    from sqlalchemy import text

    from taskplane.store.db import create_engine

    engine = create_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = {str(o): int(n) for o, n in await conn.execute(text("SELECT outcome, count(*) FROM llm_calls GROUP BY 1"))}
            doubled = (await conn.execute(text(
                "SELECT count(*) FROM (SELECT split_part(attempt_key, ':', 1), split_part(attempt_key, ':', 2) "
                "FROM llm_calls WHERE outcome = 'success' GROUP BY 1, 2 HAVING count(*) > 1) d"))).scalar_one()
            why = {f"{o}/{e}": int(n) for o, e, n in await conn.execute(text(
                "SELECT outcome, error_type, count(*) FROM llm_calls WHERE outcome <> 'success' GROUP BY 1, 2"))}
    finally:
        await engine.dispose()
    return {**rows, "calls_with_two_success_rows": int(doubled), **({"not_success": why} if why else {})}


@contextlib.contextmanager
def embedded_postgres(workdir: Path) -> Any:
    """An embedded Postgres with taskplane's schema for the run, stopped and removed after."""
    from taskplane.ports import free_port
    from taskplane.store import embedded
    from taskplane.store.migrate import upgrade

    data = workdir / "pg" / "data"
    url = embedded.start(data, free_port())
    try:
        upgrade(url)
        yield url
    finally:
        embedded.destroy(data)


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


def run(calls: int = 1000, replicas: int = 4, max_tokens: int = 32, speed: float = 20.0, timeout_s: float = 300.0,
        workdir: Path | None = None, admission: bool = True, data_planes: tuple[str, ...] = ("envoy",),
        postgres: bool = False, rounds: int = 1) -> dict[str, Any]:
    """Start replicas + one gateway per data plane, run the phases, stop everything; return the figures."""
    _raise_fd_limit(4 * calls + 1024)  # inherited by the gateway and replicas started below
    data_planes = tuple(p for p in data_planes if p != "direct") or ("envoy",)  # the direct phase always runs
    unknown = [p for p in data_planes if p not in PLANES]
    if unknown:
        raise ValueError(f"unknown data plane(s) {unknown}: choose from direct, {', '.join(PLANES)}")
    saved = os.environ.get("TASKPLANE_DATA_PLANE")
    os.environ.setdefault(PROBE_ENV, LOOP_PROBE_S)  # inherited by the gateways started below
    with tempfile.TemporaryDirectory(prefix="tp-gw-load-") as tmp, contextlib.ExitStack() as stack:
        wd = workdir or Path(tmp)
        database_url = stack.enter_context(embedded_postgres(wd)) if postgres else None
        cluster = pin_ports(LocalCluster(wd, replicas=replicas, speed=speed, kv_blocks=8192, database_url=database_url,
                                         config_overrides=load_config(calls, admission)))
        try:
            _use_plane(data_planes[0])
            with cluster:
                assert cluster.gateway_pid is not None
                gateways = {data_planes[0]: (cluster.gateway_url, cluster.gateway_pid)}
                for plane in data_planes[1:]:
                    _use_plane(plane)
                    gateways[plane] = cluster.add_gateway()
                res = asyncio.run(bench(cluster, calls, max_tokens, timeout_s, gateways, rounds))
                res["admission"] = admission
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
    res = run(args.calls, args.replicas, args.max_tokens, args.speed, args.timeout_s, admission=not args.no_admission,
              data_planes=planes, postgres=args.postgres, rounds=max(1, args.rounds))
    print(render(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=2))
    failed = sum(n for r in res["rounds"] for n in r["errors"].values())
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
