"""Plain data crossing the scheduler boundary.

The gateway (live) and the cluster simulator (virtual time) both build a
``ClusterSnapshot`` and a ``CallRequest`` and get back a ``Decision``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


@dataclass(slots=True)
class ReplicaView:
    """What the scheduler knows about one replica at decision time."""

    name: str
    model: str  # the model this replica serves (or will serve after a cold start)
    gpu: str
    cost_per_hour_usd: float
    healthy: bool = True
    model_loaded: bool = True  # weight warmth
    kv_blocks_total: int = 1
    kv_blocks_free: int = 1
    block_size: int = 16
    num_running: int = 0
    num_waiting: int = 0
    inflight_prefill_tokens: int = 0  # prompt tokens queued/being prefilled (gateway's own count)
    inflight_decode_tokens: int = 0  # completion tokens still to generate
    has_kv_events: bool = False


@dataclass(slots=True)
class CallRequest:
    """One LLM call as the scheduler sees it."""

    model: str
    prompt_tokens: int
    max_tokens: int
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of full prompt blocks
    tenant: str = "default"
    priority: str = "standard"
    session_id: str | None = None
    task_id: str | None = None
    step: int | None = None
    steps_remaining: int | None = None
    budget_ms: float | None = None
    sunk_cost_usd: float = 0.0
    allow_fallback: bool = False
    now_s: float = 0.0  # decision time (wall or virtual), seconds


class Action(StrEnum):
    PLACE = "place"
    QUEUE = "queue"  # admission control holds the call
    SHED = "shed"  # 429 overloaded
    UNMEETABLE = "unmeetable"  # 504 deadline_unmeetable
    NO_REPLICA = "no_replica"  # 503


@dataclass(slots=True)
class Decision:
    action: Action
    replica: str | None = None
    model: str | None = None  # the model that will serve (fallback when moved)
    cached_blocks: int = 0
    predicted_ttft_ms: float | None = None
    predicted_total_ms: float | None = None
    scores: dict[str, float] = field(default_factory=dict)  # plugin -> score of the chosen replica
    reason: str = ""
    retry_after_s: float | None = None
