"""Measure the real-vLLM tier on this machine: replica start time, per-call latency and
memory per replica. Prints one JSON object (the figures in docs/vllm.md come from it).

    .venv/bin/python -m benchmarks.vllm_figures [--replicas 2] [--calls 30] [--num-blocks 64]

Needs scripts/install-vllm.sh to have run. Everything it starts, it stops.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from taskplane.engines.vllm_launcher import VllmOptions, VllmReplica, start_replicas, stop_replicas


def _memory_mib(replica: VllmReplica) -> dict[str, int]:
    """PSS (shared pages split fairly) and RSS summed over the replica's process group."""
    pids = subprocess.run(["pgrep", "-g", str(replica.pid)], capture_output=True, text=True).stdout.split()
    pss = rss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
                elif line.startswith("Rss:"):
                    rss += int(line.split()[1])
        except OSError:
            continue
    return {"processes": len(pids), "pss_mib": pss // 1024, "rss_mib": rss // 1024}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _time_calls(client: httpx.Client, replica: VllmReplica, calls: int, body: dict, *,
                fresh_prompt: int = 0) -> dict[str, float]:
    """Sequential calls; ``fresh_prompt`` > 0 sends a new random prompt of that many tokens
    each time (no prefix-cache hit), else the same body (a warm cache after the first)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    latencies = []
    for _ in range(calls):
        payload = {"model": replica.model, **body}
        if fresh_prompt:
            payload["prompt"] = "".join(uuid.uuid4().hex for _ in range(fresh_prompt // 32 + 1))[:fresh_prompt]
        start = time.perf_counter()
        resp = client.post(f"{replica.url}{path}", json=payload)
        latencies.append((time.perf_counter() - start) * 1000)
        resp.raise_for_status()
    return {"p50_ms": round(statistics.median(latencies), 1), "p90_ms": round(_percentile(latencies, 0.9), 1),
            "min_ms": round(min(latencies), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--num-blocks", type=int, default=64)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="taskplane-vllm-figures-") as tmp:
        t0 = time.monotonic()
        replicas = start_replicas(Path(tmp), args.replicas, VllmOptions(num_blocks=args.num_blocks))
        start_s = time.monotonic() - t0
        try:
            r = replicas[0]
            with httpx.Client(timeout=120.0) as client:
                chat = {"messages": [{"role": "system", "content": "You are terse."},
                                     {"role": "user", "content": "Fix the failing test in parse.py."}],
                        "max_tokens": 16}
                figures = {
                    "replicas": args.replicas,
                    "num_blocks": args.num_blocks,
                    "start_all_s": round(start_s, 1),
                    "chat_50_prompt_16_out": _time_calls(client, r, args.calls, chat),
                    "completion_1000_prompt_1_out_cached": _time_calls(
                        client, r, args.calls, {"prompt": "x" * 1000, "max_tokens": 1}),
                    "completion_1000_prompt_1_out_uncached": _time_calls(
                        client, r, args.calls, {"max_tokens": 1}, fresh_prompt=1000),
                    "completion_11_prompt_128_out": _time_calls(
                        client, r, max(5, args.calls // 3), {"prompt": "hello there", "max_tokens": 128}),
                    "memory": [_memory_mib(x) for x in replicas],
                }
        finally:
            stop_replicas(replicas)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
