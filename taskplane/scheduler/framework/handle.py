"""The narrow handle a plugin gets: what it may read of the scheduler's state.

A plugin never sees the scheduler: it reads the KV index, the tenants, the latency model
and the session pins (as a read-only view) through this handle, and how the per-decision
state should judge saturation (:class:`Load`, which flow control sets when it composes
the pipeline). Keeping it narrow keeps the pipeline ignorant of what composes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from taskplane.scheduler.adapter_cost import AdapterWarmth
from taskplane.scheduler.kvindex import KVIndex
from taskplane.scheduler.latency import LatencyModel
from taskplane.scheduler.predict import Predictor
from taskplane.scheduler.swapcost import SwapCosts
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.tenants import TenantPolicy
from taskplane.scheduler.types import CallRequest


class SessionsView(Protocol):
    """The session pins as plugins read them (the session plugin alone writes them)."""

    def get(self, session: str | None, now_s: float) -> str | None:
        """The replica ``session`` is pinned to, if the pin is still alive (expires it if not)."""
        ...

    def sweep(self, now_s: float, every_s: float = 1.0) -> None:
        """Expire idle pins past their TTL, so working sets count live sessions only."""
        ...

    def working_sets_of_rows(self, table: ReplicaTable, rows: np.ndarray) -> np.ndarray:
        """Context tokens pinned to each replica at ``rows`` of ``table``."""
        ...

    def work_of_rows(self, table: ReplicaTable, rows: np.ndarray) -> np.ndarray:
        """Calls still to come of the sessions pinned to each replica at ``rows`` of ``table``."""
        ...

    def working_set_of_row(self, table: ReplicaTable, row: int) -> float:
        """``working_sets_of_rows`` for one row."""
        ...


class RoomLimit(Protocol):
    """The share of a replica's KV cache a call may fill with pinned contexts plus its own
    (working-set admission), or None when the rule does not apply to it. ``starts_task``
    is asked last, and only if needed: it may look the session's pin up and expire it."""

    def __call__(self, request: CallRequest, starts_task: Callable[[], bool]) -> float | None: ...


@dataclass(slots=True)
class Load:
    """How a decision judges a replica saturated: ``max_waiting`` engine-queued calls, a
    full batch or too few free KV blocks, or (with ``room_limit``) no working-set room.
    The pipeline's default; flow control sets its own when it holds calls back."""

    max_waiting: int = 2
    holds_calls: bool = False  # a saturated replica gets no call: flow control queues it instead
    room_limit: RoomLimit | None = None
    # what one host-tier KV block counts for in working-set room against one GPU block: a
    # session parked on host is not lost, only its reload costs (0: GPU room only)
    room_host_share: float = 0.0

    def room_tokens(self, limit: float, gpu_blocks: Any, host_blocks: Any, block_size: Any) -> Any:
        """Context tokens the pinned sessions of a replica (or of each of an array of them)
        may hold under working-set ``limit``: its GPU blocks, plus its host-tier blocks at
        ``room_host_share``. The GPU-only value is computed exactly as it always was."""
        share = self.room_host_share
        if share > 0.0:
            return limit * (gpu_blocks + share * host_blocks) * block_size
        return limit * gpu_blocks * block_size


@dataclass(slots=True)
class Handle:
    """What plugins (and the per-decision state) may read: never the scheduler itself."""

    kv_index: KVIndex
    latency: LatencyModel
    tenants: dict[str, TenantPolicy]
    rng: np.random.Generator
    sessions: SessionsView | None = None
    load: Load = field(default_factory=Load)
    metrics: bool = True
    policy: str = "custom"
    # what the pipeline has learned of the future (steps left, session ends, gaps, outputs)
    predictor: Predictor = field(default_factory=Predictor)
    # where LoRA adapters' weights probably are (a plugin mirroring its placements offers it
    # in ``bind``); None: only what the replicas report
    adapter_warmth: AdapterWarmth | None = None
    # how long a model swap takes on a replica hosting several base models (vLLM sleep mode)
    swap: SwapCosts = field(default_factory=SwapCosts)
