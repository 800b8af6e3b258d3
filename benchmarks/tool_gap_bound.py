"""How fast could the first call after a tool gap be, and where does it lose?

    python -m benchmarks.tool_gap_bound --load L [--host-kv-gb G] [--kv-mult M] [--seed N]

Runs the `taskplane` preset on the agents bench's workload (4 x H100, L times the GPU-only
capacity 0.835 tasks/s) and compares the first calls after a tool gap (>= 1 s) with warm
calls, as `tool_gap_ttft_p99_ms` / `warm_ttft_p99_ms` do. Three views:

* the bound: each call's TTFT minus the prefill of the context tokens it recomputed
  (what it would have taken had its whole previous context still been cached; the
  difference is priced on the roofline of an idle H100, chunks of 8,192 tokens);
* the intrinsic part: the prefill of the new tokens alone (the tool result) on an idle H100;
* the anatomy of the slowest 2 %: held in admission, engine queue, prefill; how many had
  moved replica (and so lost their context) and how much context they lost.

``--kv-mult 20`` gives every replica 20x the GPU KV blocks: nothing is evicted.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from benchmarks.anatomy import idle_prefill_s, step_costs
from taskplane.bench.runner import run_policy
from taskplane.bench.suite import lifetimes_for
from taskplane.bench.tiers import TOOL_GAP_S, tier_metrics
from taskplane.bench.workloads import DEFAULT_WINDOW_S, agent_tenants, agent_workload, tasks_for
from taskplane.scheduler.policies import build_policy
from taskplane.sim.fleet import ClusterSpec
from taskplane.sim.gpus import default_kv_blocks
from taskplane.sim.hosttier import TierSpec
from taskplane.sim.results import Outcome

CAPACITY = 0.835  # tasks/s of h100:4 without a host tier (docs/benchmarks.md)
COSTS = step_costs("h100", "llama-3.1-8b")


def prefill_s(new: int, cached: int) -> float:
    """Prefill of ``new`` tokens after ``cached`` ones on an idle H100 (the roofline)."""
    return idle_prefill_s(new, cached, COSTS)


def p99_ms(xs: list[float]) -> float:
    return float(np.percentile(np.asarray(xs), 99)) * 1000


def call_rows(res: Any, wl: Any) -> list[dict[str, Any]]:
    """Every served call after a task's first: its TTFT and the parts of it, the context it
    lost, and its bound had its whole previous context stayed cached."""
    spec = {(t.task_id, i): c for t in wl.tasks for i, c in enumerate(t.calls)}
    first: dict[tuple[str, int], float] = {}
    for c in res.calls:
        key = (c.task_id, c.step)
        first[key] = min(first.get(key, c.offered_s), c.offered_s)
    ok = {(c.task_id, c.step): c for c in res.calls if c.outcome is Outcome.SUCCESS and c.first_token_s is not None}
    rows: list[dict[str, Any]] = []
    for (tid, k), c in ok.items():
        if k == 0:
            continue
        s, prev = spec[(tid, k)], ok.get((tid, k - 1))
        assert c.first_token_s is not None
        whole = c.prompt_tokens - s.append_tokens  # the previous call's context, all of it
        ttft = c.first_token_s - first[(tid, k)]
        dispatched = c.dispatched_s if c.dispatched_s is not None else c.offered_s
        admitted = c.admitted_s if c.admitted_s is not None else c.first_token_s
        saved = prefill_s(c.prompt_tokens - c.cached_tokens, c.cached_tokens) - prefill_s(s.append_tokens, whole)
        rows.append({"gap": s.gap_s >= TOOL_GAP_S, "ttft": ttft, "held": dispatched - first[(tid, k)],
                     "queue": admitted - dispatched, "prefill": c.first_token_s - admitted,
                     "lost": max(0, whole - c.cached_tokens), "new": s.append_tokens,
                     "moved": prev is not None and prev.replica != c.replica,
                     "bound": max(ttft - max(saved, 0.0), 0.0), "alone": prefill_s(s.append_tokens, whole)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--host-kv-gb", type=float, default=256.0)
    ap.add_argument("--kv-mult", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rate = a.load * CAPACITY
    wl = agent_workload(tasks_for(rate, DEFAULT_WINDOW_S), rate, a.seed)
    blocks = int(default_kv_blocks("h100", "llama-3.1-8b", wl.block_size) * a.kv_mult) if a.kv_mult != 1 else None
    cluster = ClusterSpec.fleet("h100:4", kv_blocks=blocks)
    cluster.tiers = TierSpec(host_kv_gb=a.host_kv_gb)
    policy = build_policy("taskplane", seed=a.seed, tenants=agent_tenants(), metrics=False)
    res = run_policy(policy, wl, cluster, seed=a.seed, kv_lifetimes=lifetimes_for("taskplane")).result

    rows = call_rows(res, wl)
    gap = [r for r in rows if r["gap"]]
    warm = [r for r in rows if not r["gap"]]
    tm = tier_metrics(res, wl)
    print(f"agents 4 x H100, load {a.load}x, host {a.host_kv_gb:g} GB, GPU KV x{a.kv_mult:g}, seed {a.seed}: "
          f"{len(gap)} calls after a tool gap, {len(warm)} warm")
    g, w = tm["tool_gap_ttft_p99_ms"], tm["warm_ttft_p99_ms"]
    print(f"  measured: after a tool gap p99 {g:.0f} ms, warm p99 {w:.0f} ms = {g / w:.2f}x")
    gb, wb = p99_ms([r["bound"] for r in gap]), p99_ms([r["bound"] for r in warm])
    print(f"  bound (whole previous context cached): after a tool gap p99 {gb:.0f} ms = {gb / w:.2f}x the measured "
          f"warm p99; warm bound {wb:.0f} ms -> {gb / wb:.2f}x")
    print(f"  the tool result alone on an idle H100: p99 {p99_ms([r['alone'] for r in gap]):.0f} ms after a gap, "
          f"{p99_ms([r['alone'] for r in warm]):.0f} ms warm; new tokens p99 "
          f"{np.percentile([r['new'] for r in gap], 99):.0f} vs {np.percentile([r['new'] for r in warm], 99):.0f}")
    for name, xs in (("after a tool gap", gap), ("warm", warm)):
        cut = np.percentile([r["ttft"] for r in xs], 98)
        tail = [r for r in xs if r["ttft"] >= cut]

        def mean(key: str, tail: list[dict[str, Any]] = tail) -> float:
            return float(np.mean([r[key] for r in tail]))

        moved = [r for r in xs if r["moved"]]
        no_move = p99_ms([r["bound"] if r["moved"] else r["ttft"] for r in xs])
        print(f"  {name}, slowest 2 % ({len(tail)}): TTFT {mean('ttft') * 1000:.0f} ms = held {mean('held') * 1000:.0f}"
              f" + engine queue {mean('queue') * 1000:.0f} + prefill {mean('prefill') * 1000:.0f}; moved "
              f"{mean('moved'):.0%}, context lost {mean('lost'):.0f} tokens; of all: moved {len(moved) / len(xs):.1%}; "
              f"p99 if no call had moved {no_move:.0f} ms")
    broken = getattr(policy.pipeline.handle.sessions, "broken", None)  # the session book's pins broken, by reason
    print(f"  KV lifetimes {tm['kv_lifetimes']}; pins broken {broken}")


if __name__ == "__main__":
    main()
