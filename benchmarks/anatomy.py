"""Where a run's TTFT goes, and how fast it could be at all.

A call's time to first token in the simulator splits into four parts: held in flow
control (offered to dispatched), queued in the engine (dispatched to admitted), KV loaded
from a host / remote tier (the transfer its admission added to a step) and prefill compute
(the rest, to the first token). :func:`ttft_parts` gives them per call and
:func:`anatomy` says which part the slowest calls lose in.

The bound: every call on an idle replica with an infinite prefix cache, i.e. only the
prompt tokens no earlier call computed are prefilled, with no queue and no transfer
(:func:`idle_infinite_cache_ttft_s`, the roofline of the simulated GPU). No placement, KV
tier or admission rule can beat its percentiles on that trace; a target below it is
infeasible.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from taskplane.bench.ceiling import open_call_hits
from taskplane.sim.fleet import ReplicaSpec
from taskplane.sim.gpus import gpu_profile, model_profile
from taskplane.sim.results import CallRecord, ClusterResult, Outcome
from taskplane.sim.roofline import StepCosts
from taskplane.sim.workloads.base import Workload

PARTS = ("held", "engine_queue", "tier_load", "prefill")
CHUNK: int = ReplicaSpec("r", "h100").max_num_batched_tokens  # the simulated engine's chunked-prefill size


def idle_prefill_s(new: int, cached: int, costs: StepCosts, chunk: int = CHUNK) -> float:
    """Prefill of ``new`` prompt tokens after ``cached`` ones on an idle replica, chunk by
    chunk as the simulated engine runs it (its roofline step costs)."""
    t = 0.0
    while new > 0:
        n = min(new, chunk)
        t += costs.step(n, 0, 0, n * (cached + n / 2), 1.0)
        cached += n
        new -= n
    return t


def step_costs(gpu: str = "h100", model: str = "llama-3.1-8b") -> StepCosts:
    return StepCosts.of(gpu_profile(gpu), model_profile(model))


@dataclass(slots=True)
class TtftParts:
    """One successful call's TTFT, seconds, split into :data:`PARTS`."""

    ttft: float
    held: float
    engine_queue: float
    tier_load: float
    prefill: float


def ttft_parts(calls: Iterable[CallRecord]) -> list[TtftParts]:
    """The split of every successful attempt that produced a first token."""
    out = []
    for c in calls:
        if c.outcome is not Outcome.SUCCESS or c.first_token_s is None:
            continue
        dispatched = c.dispatched_s if c.dispatched_s is not None else c.offered_s
        admitted = c.admitted_s if c.admitted_s is not None else dispatched
        compute = c.first_token_s - admitted
        load = min(c.tier_load_s, compute)
        out.append(TtftParts(ttft=c.first_token_s - c.offered_s, held=dispatched - c.offered_s,
                             engine_queue=admitted - dispatched, tier_load=load, prefill=compute - load))
    return out


def anatomy(parts: list[TtftParts], tail: float = 0.99) -> dict[str, float]:
    """TTFT p50 / p99 (ms) and the mean of each part (ms) over all calls and over the
    calls at or above the ``tail`` quantile."""
    ttft = np.array([p.ttft for p in parts])
    cut = float(np.quantile(ttft, tail))
    slow = [p for p in parts if p.ttft >= cut]
    out = {"calls": float(len(parts)), "ttft_p50_ms": float(np.percentile(ttft, 50)) * 1000,
           "ttft_p99_ms": float(np.percentile(ttft, 99)) * 1000, "tail_calls": float(len(slow))}
    for name in PARTS:
        out[f"{name}_mean_ms"] = float(np.mean([getattr(p, name) for p in parts])) * 1000
        out[f"tail_{name}_mean_ms"] = float(np.mean([getattr(p, name) for p in slow])) * 1000
    return out


def band(result: ClusterResult, workload: Workload, lo: float, hi: float,
         costs: StepCosts | None = None) -> dict[str, float]:
    """The calls whose TTFT lies between the ``lo`` and ``hi`` quantiles (e.g. 0.4-0.6
    around the median), mean ms of each part, with prefill compute split three ways: the
    bound (idle replica, infinite cache), a colder prefix (the idle prefill of the call's
    own uncached suffix minus the bound's) and contention (its prefill beyond that idle
    time: the step budget shared with other prefills, a larger batch). Says whether a
    percentile is lost to waiting, to colder prefixes or to crowded replicas."""
    costs = costs or step_costs()
    hits = open_call_hits(workload)
    rows = []
    for c in result.calls:
        if c.outcome is not Outcome.SUCCESS or c.first_token_s is None or (c.task_id, c.step) not in hits:
            continue
        (p,) = ttft_parts([c])
        hit, prompt = hits[(c.task_id, c.step)]
        bound = idle_prefill_s(prompt - hit, hit, costs)
        own = idle_prefill_s(c.prompt_tokens - c.cached_tokens, c.cached_tokens, costs)
        rows.append((p.ttft, p.held, p.engine_queue, p.tier_load, bound, own - bound, p.prefill - own,
                     float(c.step == 0)))
    arr = np.array(rows)
    low, high = np.quantile(arr[:, 0], [lo, hi])
    sel = arr[(arr[:, 0] >= low) & (arr[:, 0] <= high)]
    names = ("ttft", "held", "engine_queue", "tier_load", "bound", "colder", "contention")
    out = {f"{n}_mean_ms": float(sel[:, k].mean()) * 1000 for k, n in enumerate(names)}
    out.update(calls=float(len(sel)), first_call_share=float(sel[:, 7].mean()))
    return out


def idle_infinite_cache_ttft_s(workload: Workload, costs: StepCosts | None = None) -> np.ndarray:
    """Per open-loop call of a trace: its TTFT on an idle replica with an infinite cache."""
    costs = costs or step_costs()
    return np.array([idle_prefill_s(prompt - hit, hit, costs) for hit, prompt in open_call_hits(workload).values()])


def summarize(result: ClusterResult, tail: float = 0.99) -> dict[str, float]:
    """:func:`anatomy` of a simulated run."""
    return anatomy(ttft_parts(result.calls), tail)
