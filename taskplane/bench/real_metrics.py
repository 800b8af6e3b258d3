"""Figures of one router's run, from the replicas' own counters and the client's clock.

Prefix hits come from vLLM itself (``vllm:prefix_cache_hits_total`` over
``vllm:prefix_cache_queries_total``, deltas over the run, summed over replicas), not from
what a router believes it placed. Busy time is measured two ways: the CPU seconds the
replica's processes burnt during the run (read from /proc: on a CPU engine that *is* the
work done), and vLLM's own per-request inference time (``vllm:request_inference_time_seconds``,
time spent running in a batch; requests batched together overlap) with the engine step
count (``vllm:iteration_tokens_total`` observations).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from taskplane.bench.metrics import percentile, task_figures
from taskplane.bench.real_client import TaskRun
from taskplane.engines.vllm_launcher import VllmReplica
from taskplane.procfs import group_members

#: counter samples read from each replica (sample name -> key)
COUNTERS: dict[str, str] = {
    "vllm:prefix_cache_queries_total": "queries",
    "vllm:prefix_cache_hits_total": "hits",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:request_success_total": "requests",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:request_inference_time_seconds_sum": "inference_s",
    "vllm:request_prefill_time_seconds_sum": "prefill_s",
    "vllm:request_queue_time_seconds_sum": "queue_s",
    "vllm:time_to_first_token_seconds_sum": "engine_ttft_s",
    "vllm:iteration_tokens_total_count": "engine_steps",
}
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(slots=True)
class ReplicaCounters:
    """One replica's counters at one moment, plus its processes' CPU seconds."""

    values: dict[str, float]
    cpu_s: float

    def minus(self, earlier: ReplicaCounters) -> dict[str, float]:
        d = {k: self.values.get(k, 0.0) - earlier.values.get(k, 0.0) for k in COUNTERS.values()}
        d["cpu_s"] = self.cpu_s - earlier.cpu_s
        return d


def parse_counters(text: str, model: str | None = None) -> dict[str, float]:
    out = dict.fromkeys(COUNTERS.values(), 0.0)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = COUNTERS.get(s.name)
            if key is None:
                continue
            if model is not None and s.labels.get("model_name") not in (None, model):
                continue
            out[key] += s.value
    return out


@dataclass(slots=True)
class Histogram:
    """One Prometheus histogram at one moment, summed over its label sets."""

    sum: float = 0.0
    count: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)  # upper bound (le) -> cumulative count


def histograms(text: str, names: Iterable[str]) -> dict[str, Histogram]:
    """The named histograms of a ``/metrics`` page (taskplane's own: the gateway's TTFT and
    admission wait, the scheduler's decision time); an absent one reads as empty."""
    out = {name: Histogram() for name in names}
    for fam in text_string_to_metric_families(text):
        h = out.get(fam.name)
        if h is None:
            continue
        for s in fam.samples:
            if s.name.endswith("_sum"):
                h.sum += s.value
            elif s.name.endswith("_count"):
                h.count += s.value
            elif s.name.endswith("_bucket"):
                bound = float(s.labels["le"])
                h.buckets[bound] = h.buckets.get(bound, 0.0) + s.value
    return out


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in process group ``pgid``."""
    return sum(int(f[11]) + int(f[12]) for f in group_members(pgid).values()) / _CLK_TCK  # utime + stime


def machine_busy_seconds() -> float:
    """CPU seconds all cores of the machine spent busy since boot (from /proc/stat)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK


def self_cpu_seconds() -> float:
    """CPU seconds of this process (the bench's client)."""
    t = os.times()
    return t.user + t.system


def snapshot(client: httpx.Client, replicas: Sequence[VllmReplica]) -> list[ReplicaCounters]:
    snaps = []
    for r in replicas:
        resp = client.get(r.metrics_url)
        resp.raise_for_status()
        snaps.append(ReplicaCounters(parse_counters(resp.text, r.model), group_cpu_seconds(r.pid)))
    return snaps


def _r(x: Any, nd: int = 4) -> Any:
    return round(x, nd) if isinstance(x, float) else x


def router_metrics(
    tasks: Sequence[TaskRun], before: Sequence[ReplicaCounters], after: Sequence[ReplicaCounters],
    *, hit_ceiling: float, wall_s: float,
) -> dict[str, Any]:
    """Every figure of one router's run (JSON-able; None where there is nothing to measure)."""
    deltas = [a.minus(b) for a, b in zip(after, before, strict=True)]
    hits = sum(d["hits"] for d in deltas)
    queries = sum(d["queries"] for d in deltas)
    calls = [c for t in tasks for c in t.calls]
    ok = [c for c in calls if c.ok]
    ttft = [c.ttft_s for c in ok if c.ttft_s is not None]
    e2e = [c.e2e_s for c in ok if c.e2e_s is not None]
    inter = [c.ttft_s for c in ok if c.ttft_s is not None and c.priority == "interactive"]
    task = task_figures([t.result for t in tasks])
    prefix = hits / queries if queries else None
    prompt = [d["prompt_tokens"] for d in deltas]
    busy = sum(d["cpu_s"] for d in deltas)
    out: dict[str, Any] = {
        "tasks": task["tasks"],
        "tasks_succeeded": task["tasks_succeeded"],
        "tasks_late": sum(1 for t in tasks if t.completed and not t.result.deadline_met),
        "tasks_abandoned": sum(1 for t in tasks if not t.completed),
        "deadline_met_ratio": task["deadline_met_ratio"],
        "calls": len(calls),
        "calls_ok": len(ok),
        "call_errors": sum(1 for c in calls if not c.ok and c.error != "deadline passed"),
        "sheds": sum(c.sheds for c in calls),
        "ttft_p50_ms": percentile(ttft, 50, 1000.0),
        "ttft_p90_ms": percentile(ttft, 90, 1000.0),
        "ttft_p99_ms": percentile(ttft, 99, 1000.0),
        "ttft_mean_ms": float(np.mean(ttft)) * 1000.0 if ttft else None,
        "ttft_interactive_p50_ms": percentile(inter, 50, 1000.0),
        "call_e2e_p50_ms": percentile(e2e, 50, 1000.0),
        "call_e2e_p99_ms": percentile(e2e, 99, 1000.0),
        "task_e2e_p50_s": task["task_e2e_p50_s"],
        "task_e2e_p99_s": task["task_e2e_p99_s"],
        "prefix_hit_ratio": prefix,
        "hit_ceiling_ratio": prefix / hit_ceiling if prefix is not None and hit_ceiling > 0 else None,
        "prefix_cache_hits": int(hits),
        "prefix_cache_queries": int(queries),
        "prompt_tokens": int(sum(prompt)),
        "prompt_tokens_computed": int(sum(prompt) - hits),
        "load_split": [round(p / sum(prompt), 3) if sum(prompt) else None for p in prompt],
        "busy_cpu_s": busy,
        "busy_ratio": busy / (wall_s * len(deltas)) if wall_s > 0 and deltas else None,
        "inference_s": sum(d["inference_s"] for d in deltas),
        "prefill_s": sum(d["prefill_s"] for d in deltas),
        "engine_queue_s": sum(d["queue_s"] for d in deltas),
        "engine_steps": int(sum(d["engine_steps"] for d in deltas)),
        "preemptions": int(sum(d["preemptions"] for d in deltas)),
        "goodput_tasks_per_busy_hour": task["tasks_succeeded"] / (busy / 3600.0) if busy > 0 else None,
        "wall_s": wall_s,
        "replicas": [{k: _r(v) for k, v in d.items()} for d in deltas],
    }
    return {k: _r(v) for k, v in out.items()}


#: the gateway's own histograms read before and after each run of taskplane's gateway
TTFT, DECISION = "taskplane_gateway_ttft_seconds", "taskplane_scheduler_decision_seconds"


def gateway_stats(client: httpx.Client, url: str) -> dict[str, Histogram]:
    """Cumulative figures from the gateway's /metrics: its own TTFT and the scheduler's decision time."""
    return histograms(client.get(f"{url}/metrics").text, (TTFT, DECISION))


def gateway_figures(before: dict[str, Histogram], after: dict[str, Histogram]) -> dict[str, Any]:
    """The gateway's own TTFT mean (from sending upstream: the rest of the client's TTFT is
    the proxy and the client) and the scheduler's decision time over the run."""
    out: dict[str, Any] = {}
    t0, t1 = before[TTFT], after[TTFT]
    if t1.count > t0.count:
        out["gateway_ttft_mean_ms"] = round((t1.sum - t0.sum) / (t1.count - t0.count) * 1000, 1)
    d0, d1 = before[DECISION], after[DECISION]
    if d1.count > d0.count:
        out["decision_mean_us"] = round((d1.sum - d0.sum) / (d1.count - d0.count) * 1e6, 1)
        counts = {b: d1.buckets[b] - d0.buckets.get(b, 0.0) for b in sorted(d1.buckets)}
        total = counts.get(float("inf"), d1.count - d0.count)
        bound = next((b for b, n in counts.items() if n >= 0.99 * total), None)
        if bound is not None and bound != float("inf"):
            out["decision_p99_us"] = round(bound * 1e6, 1)  # upper bound: the histogram's bucket edge
    return out
