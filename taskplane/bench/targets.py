"""The targets for taskplane against the best baseline, checked from results.

Simulated bench, Mooncake trace: prefix hits >= 90 % of the infinite-cache ceiling; TTFT
p50 <= 0.5x and p99 <= 0.7x the best baseline's. Agent tasks at the highest load (1.3x
overload): tasks within deadline >= 1.5x the best baseline's; cost per successful task
<= 0.6x. LoRA adapters (``adapters``): adapter cold loads <= 0.5x, TTFT p99 <= 0.8x and
cost per successful task <= 0.8x the best baseline. Real-engine bench (agents-vllm): prefix-hit ratio >= the best peer
router's; TTFT p50 <= 0.8x. "Best baseline" is the best figure any baseline (any other
policy or router) reached on that metric (each metric on its own).
"""

from __future__ import annotations

from typing import Any

from taskplane.bench.real_workload import WORKLOAD_NAME as REAL_WORKLOAD

OURS = "taskplane"


def best_baseline(policies: dict[str, dict[str, Any]], key: str, lower_is_better: bool) -> tuple[str, float] | None:
    """The best figure any entry but taskplane reached on ``key``: (its name, the figure)."""
    vals = [(name, m[key]) for name, m in policies.items() if name != OURS and m.get(key) is not None]
    if not vals:
        return None
    return (min if lower_is_better else max)(vals, key=lambda x: x[1])


def _check(
    policies: dict[str, dict[str, Any]], key: str, *, lower_is_better: bool, limit: float, what: str
) -> dict[str, Any] | None:
    ours = policies.get(OURS, {}).get(key)
    best = best_baseline(policies, key, lower_is_better)
    if ours is None or best is None:
        return None
    name, value = best
    if value == 0:  # nothing to divide by: equal when both are 0, else infinitely apart
        ratio = 1.0 if ours == 0 else float("inf")
    else:
        ratio = ours / value
    ok = ratio <= limit if lower_is_better else ratio >= limit
    return {"target": what, "metric": key, "taskplane": ours, "best_baseline": name, "baseline": value,
            "ratio": None if ratio == float("inf") else round(ratio, 3),
            "limit": limit, "met": ok}


def evaluate(workload: str, policies: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per target that the policies present allow to check."""
    out: list[dict[str, Any] | None] = []
    ours = policies.get(OURS)
    if ours is None:
        return []
    if workload == "mooncake":
        r = ours.get("hit_ceiling_ratio")
        if r is not None:
            out.append({"target": "prefix hits >= 90% of the infinite-cache ceiling",
                        "metric": "hit_ceiling_ratio", "taskplane": r, "best_baseline": None,
                        "baseline": None, "ratio": r, "limit": 0.9, "met": r >= 0.9})
        out.append(_check(policies, "ttft_p50_ms", lower_is_better=True, limit=0.5,
                          what="TTFT p50 <= 0.5x the best baseline"))
        out.append(_check(policies, "ttft_p99_ms", lower_is_better=True, limit=0.7,
                          what="TTFT p99 <= 0.7x the best baseline"))
    elif workload == "adapters":
        out.append(_check(policies, "adapter_cold_loads", lower_is_better=True, limit=0.5,
                          what="adapter cold loads <= 0.5x the best baseline"))
        out.append(_check(policies, "ttft_p99_ms", lower_is_better=True, limit=0.8,
                          what="TTFT p99 <= 0.8x the best baseline"))
        out.append(_check(policies, "cost_per_successful_task_usd", lower_is_better=True, limit=0.8,
                          what="cost per successful task <= 0.8x the best baseline"))
    elif workload == REAL_WORKLOAD:
        out.append(_check(policies, "prefix_hit_ratio", lower_is_better=False, limit=1.0,
                          what="prefix-hit ratio >= the best peer's"))
        out.append(_check(policies, "ttft_p50_ms", lower_is_better=True, limit=0.8,
                          what="TTFT p50 <= 0.8x the best peer's"))
    else:
        out.append(_check(policies, "deadline_met_ratio", lower_is_better=False, limit=1.5,
                          what="tasks within deadline >= 1.5x the best baseline"))
        out.append(_check(policies, "cost_per_successful_task_usd", lower_is_better=True, limit=0.6,
                          what="cost per successful task <= 0.6x the best baseline"))
    return [x for x in out if x is not None]
