"""The load generator of the live benches: streamed chat calls, timed by the client.

Each call records its time to first token and to ``[DONE]``, and the client's own marks
from httpx's trace events (connected, request sent, response headers); a phase sends many
at once from several small connection pools and reduces them to percentiles.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

MODEL = "llama-3.1-8b"


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


def request_body(i: int, max_tokens: int) -> dict[str, Any]:
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
            return await one_call(clients[i % shards], urls[i % len(urls)], request_body(i, max_tokens), headers)

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
