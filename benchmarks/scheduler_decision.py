"""Micro-benchmark of one scheduling decision (not a timed test).

Builds a fleet of N replicas of mixed GPU generations whose precise KV index holds about
one million blocks in total (fed through real ``BlockStored`` events: shared system
prompts on many replicas plus per-session conversations), then times
``FlowControl.decide`` for a mix of calls: continuing sessions (long prefix walks),
new sessions on a shared system prompt (wide replica masks) and unrelated prompts.
Block hashes are computed beforehand, as the gateway does before deciding.

    python -m benchmarks.scheduler_decision [--replicas 16,256,1024] [--blocks 1000000]
                                       [--policies taskplane,...] [--decisions 3000]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from taskplane.scheduler import build_policy, policy_names
from taskplane.scheduler.feedback import RoutingMemory
from taskplane.scheduler.flowcontrol.controller import FlowControl
from taskplane.scheduler.hashing import chain_hashes
from taskplane.scheduler.kvindex import KVIndex
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.types import CallRequest, ReplicaView

BLOCK = 16
GPUS = [("h100", 2.5), ("h200", 3.2), ("b200", 5.5), ("l40s", 0.9)]
SYSTEM_BLOCKS = 32  # a shared system prompt: 512 tokens
FAMILIES = 64


@dataclass
class Fleet:
    replicas: list[ReplicaView]
    index: KVIndex
    sessions: list[tuple[str, list[int]]]  # (replica holding it, its tokens)
    families: list[list[int]]
    indexed_blocks: int


def _tokens(rng: random.Random, n_blocks: int) -> list[int]:
    return [rng.randrange(1, 128_000) for _ in range(n_blocks * BLOCK)]


def build_fleet(n_replicas: int, total_blocks: int, seed: int = 1) -> Fleet:
    """Replicas and a precise KV index with ``total_blocks`` (replica, block) entries."""
    rng = random.Random(seed)
    families = [_tokens(rng, SYSTEM_BLOCKS) for _ in range(FAMILIES)]
    per_replica = max(total_blocks // n_replicas, SYSTEM_BLOCKS * 2)
    index = KVIndex()
    replicas: list[ReplicaView] = []
    sessions: list[tuple[str, list[int]]] = []
    indexed = 0
    eng = 1
    for i in range(n_replicas):
        name = f"replica-{i:04d}"
        gpu, price = GPUS[i % len(GPUS)]
        held = 0
        events: list[dict[str, Any]] = []
        fams = rng.sample(range(FAMILIES), k=min(4, FAMILIES))
        for f in fams:  # shared system prompts
            hashes = list(range(eng, eng + SYSTEM_BLOCKS))
            eng += SYSTEM_BLOCKS
            events.append(_stored(hashes, None, families[f]))
            held += SYSTEM_BLOCKS
        while held < per_replica:  # conversations continuing a system prompt
            f = fams[rng.randrange(len(fams))]
            n = min(rng.randint(32, 256), per_replica - held)
            convo = _tokens(rng, n)
            hashes = list(range(eng, eng + SYSTEM_BLOCKS + n))
            eng += SYSTEM_BLOCKS + n
            # the engine re-announces the prefix under its own hashes; ours dedupe it
            events.append(_stored(hashes, None, families[f] + convo))
            held += n
            if rng.random() < 0.2:
                sessions.append((name, families[f] + convo))
        index.apply_events(name, events)
        indexed += held
        # an 8B model on one GPU holds ~30k-60k blocks of 16 tokens; cached blocks nobody
        # references count as free (vLLM evicts them on demand)
        total = max(int(per_replica * 1.25), 32_768)
        replicas.append(
            ReplicaView(
                name=name,
                model="llama-3.1-8b",
                gpu=gpu,
                cost_per_hour_usd=price,
                kv_blocks_total=total,
                kv_blocks_free=total - rng.randint(0, total // 2),
                block_size=BLOCK,
                num_running=rng.randint(0, 48),
                num_waiting=rng.randint(0, 1),
                inflight_prefill_tokens=rng.randint(0, 4096),
                has_kv_events=True,
            )
        )
    return Fleet(replicas, index, sessions, families, indexed)


def _stored(hashes: list[int], parent: int | None, toks: list[int]) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": toks, "block_size": BLOCK, "lora_id": None, "medium": "GPU"}


def make_requests(fleet: Fleet, n: int, seed: int = 2) -> list[CallRequest]:
    """A call mix: 50 % continue a session, 35 % open one on a shared system prompt,
    15 % unrelated; prompts of 1k-8k tokens; every other call with a deadline budget."""
    rng = random.Random(seed)
    out: list[CallRequest] = []
    for i in range(n):
        r = rng.random()
        if r < 0.5 and fleet.sessions:
            _, toks = fleet.sessions[rng.randrange(len(fleet.sessions))]
            toks = toks + _tokens(rng, 2)
        elif r < 0.85:
            toks = fleet.families[rng.randrange(FAMILIES)] + _tokens(rng, rng.randint(16, 200))
        else:
            toks = _tokens(rng, rng.randint(64, 512))
        out.append(
            CallRequest(
                model="llama-3.1-8b",
                prompt_tokens=len(toks),
                max_tokens=rng.choice([128, 256, 512]),
                block_hashes=chain_hashes(toks, BLOCK),
                block_size=BLOCK,
                tenant=rng.choice(["acme", "globex", "default"]),
                priority=rng.choice(["interactive", "standard", "batch"]),
                session_id=f"s{rng.randrange(5000)}",
                step=rng.randrange(10),
                steps_remaining=rng.randrange(10),
                budget_ms=rng.choice([None, 30_000.0, 120_000.0]),
                sunk_cost_usd=rng.random() * 0.5,
                call_id=f"c{i}",
            )
        )
    return out


def share_index(sched: FlowControl, index: KVIndex) -> None:
    """Point a freshly built policy at a prebuilt KV index: the pipeline's handle (what its
    plugins read) and the hook that records routed prompts into the index."""
    pipeline = sched.pipeline
    pipeline.handle.kv_index = index
    for hook in pipeline.hooks:
        if isinstance(hook, RoutingMemory):
            hook.kv_index = index


def time_decisions(
    policy: str, fleet: Fleet, requests: list[CallRequest], warmup: int = 200, *, use_table: bool = True
) -> dict[str, float]:
    """p50 / p99 / mean of ``decide`` in microseconds for one policy.

    ``use_table``: pass a ``ReplicaTable`` (what the gateway and simulator keep) rather than
    a list of views, which costs O(replicas) Python work per decision to convert.
    """
    sched = build_policy(policy, seed=0)
    share_index(sched, fleet.index)  # the 1M-block index, built once per fleet
    replicas: ReplicaTable | list[ReplicaView] = ReplicaTable(fleet.replicas) if use_table else fleet.replicas
    for req in requests[:warmup]:
        sched.decide(req, replicas, 0.0)
    samples = np.empty(len(requests) - warmup)
    cpu = np.empty(len(requests) - warmup)
    clock = time.perf_counter_ns
    cpu_clock = time.thread_time_ns
    actions: dict[str, int] = {}
    for k, req in enumerate(requests[warmup:]):
        c0 = cpu_clock()
        t0 = clock()
        d = sched.decide(req, replicas, float(k))
        t1 = clock()
        cpu[k] = (cpu_clock() - c0) / 1000.0
        samples[k] = (t1 - t0) / 1000.0
        actions[d.action.value] = actions.get(d.action.value, 0) + 1
    return {
        "p50_us": float(np.percentile(samples, 50)),
        "p99_us": float(np.percentile(samples, 99)),
        "mean_us": float(samples.mean()),
        # CPU time of the deciding thread: unaffected by other processes preempting it
        "cpu_p50_us": float(np.percentile(cpu, 50)),
        "cpu_p99_us": float(np.percentile(cpu, 99)),
        "decisions": len(samples),
        "actions": actions,  # type: ignore[dict-item]
    }


def run(
    replica_counts: tuple[int, ...] = (16, 256, 1024),
    *,
    total_blocks: int = 1_000_000,
    policies: tuple[str, ...] = ("taskplane",),
    decisions: int = 3000,
    inputs: tuple[str, ...] = ("table",),
) -> dict[str, Any]:
    """Benchmark every policy at every fleet size; returns a JSON-able report."""
    report: dict[str, Any] = {"indexed_blocks_target": total_blocks, "results": []}
    for n in replica_counts:
        t0 = time.perf_counter()
        fleet = build_fleet(n, total_blocks)
        build_s = time.perf_counter() - t0
        requests = make_requests(fleet, decisions + 200)
        gc.collect()
        for policy in policies:
            for kind in inputs:
                stats = time_decisions(policy, fleet, requests, use_table=kind == "table")
                report["results"].append(
                    {"replicas": n, "policy": policy, "input": kind, "indexed_blocks": fleet.indexed_blocks,
                     "distinct_hashes": len(fleet.index.precise), "index_build_s": round(build_s, 1), **stats}
                )
        del fleet
        gc.collect()
    try:
        report["loadavg"] = " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        report["loadavg"] = "?"
    return report


def _table(report: dict[str, Any]) -> str:
    lines = [
        f"{'replicas':>8} {'policy':<20} {'input':<6} {'p50 µs':>8} {'p99 µs':>8} "
        f"{'cpu p50':>8} {'cpu p99':>8}  indexed blocks"
    ]
    for r in report["results"]:
        lines.append(
            f"{r['replicas']:>8} {r['policy']:<20} {r['input']:<6} {r['p50_us']:>8.0f} {r['p99_us']:>8.0f} "
            f"{r['cpu_p50_us']:>8.0f} {r['cpu_p99_us']:>8.0f}  {r['indexed_blocks']:,}"
        )
    lines.append(f"(load average during the run: {report.get('loadavg', '?')})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", default="16,256,1024")
    ap.add_argument("--blocks", type=int, default=1_000_000)
    ap.add_argument("--policies", default="taskplane", help=f"comma-separated or 'all' ({', '.join(policy_names())})")
    ap.add_argument("--decisions", type=int, default=3000)
    ap.add_argument("--input", default="table", help="table, list or table,list: how replicas are passed")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    policies = tuple(policy_names()) if args.policies == "all" else tuple(args.policies.split(","))
    report = run(
        tuple(int(x) for x in args.replicas.split(",")),
        total_blocks=args.blocks,
        policies=policies,
        decisions=args.decisions,
        inputs=tuple(args.input.split(",")),
    )
    print(json.dumps(report, indent=2) if args.json else _table(report))


if __name__ == "__main__":
    main()
