"""What one attempt cost: the replica's GPU-seconds attributed to the call times its
price per hour.

The attribution is the call's share of the batch: while a call runs, the replica serves
``b`` calls at once (continuous batching), so the call is charged ``duration / b``
GPU-seconds, with ``b`` averaged over the call's start and end as seen by the gateway
(and at least 1). Cached prompt tokens cost no prefill, which shows as a shorter
duration. docs/costs.md documents the model and its limits.
"""

from __future__ import annotations


def gpu_seconds(duration_s: float, batch_at_start: int, batch_at_end: int) -> float:
    share = max(1.0, (batch_at_start + batch_at_end) / 2.0)
    return max(0.0, duration_s) / share


def cost_usd(gpu_s: float, price_per_hour_usd: float) -> float:
    return gpu_s * price_per_hour_usd / 3600.0
