"""The cost model, as pure functions: GPU-seconds attributed to a call times the price book.

A call does not own its replica: during prefill it shares the GPU with the other
prefills of the same scheduler steps, during decode with the rest of the running batch.
So its GPU-seconds are its share of each phase, and its cost is those GPU-seconds times
the replica's price per hour. Pools that are external APIs are priced per token
instead. docs/costs.md explains the model and its limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class PriceEntry:
    """One line of the price book: a GPU generation or an external API pool."""

    gpu: str
    cost_per_hour_usd: float = 0.0
    usd_per_prompt_token: float | None = None
    usd_per_cached_token: float | None = None
    usd_per_completion_token: float | None = None
    version: int | None = None
    valid_from: datetime | None = None

    @property
    def per_token(self) -> bool:
        """True for external API pools: cost follows tokens, not GPU time."""
        return self.usd_per_prompt_token is not None or self.usd_per_completion_token is not None


def attributed_gpu_seconds(
    prefill_s: float,
    decode_s: float,
    *,
    decode_batch_size: float = 1.0,
    prefill_batch_size: float = 1.0,
) -> float:
    """The GPU time a call is charged: each phase's wall time divided by how many calls shared it.

    ``decode_batch_size`` is the mean number of sequences running while this call decoded
    (vLLM's ``num_requests_running``), ``prefill_batch_size`` the same during its prefill
    (1 when it ran alone). Queue time is not charged: the GPU served others meanwhile.
    """
    prefill = max(prefill_s, 0.0) / max(prefill_batch_size, 1.0)
    decode = max(decode_s, 0.0) / max(decode_batch_size, 1.0)
    return prefill + decode


def call_cost_usd(
    price: PriceEntry,
    *,
    gpu_seconds: float,
    prompt_tokens: int = 0,
    cached_tokens: int = 0,
    completion_tokens: int = 0,
) -> float:
    """The cost of one attempt: per token for API pools, else GPU-seconds times the hourly price."""
    if price.per_token:
        prompt_price = price.usd_per_prompt_token or 0.0
        cached_price = price.usd_per_cached_token if price.usd_per_cached_token is not None else prompt_price
        uncached = max(prompt_tokens - cached_tokens, 0)
        return (
            uncached * prompt_price
            + min(cached_tokens, prompt_tokens) * cached_price
            + completion_tokens * (price.usd_per_completion_token or 0.0)
        )
    return max(gpu_seconds, 0.0) * price.cost_per_hour_usd / 3600.0
