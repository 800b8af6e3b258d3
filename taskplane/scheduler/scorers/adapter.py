"""Adapter affinity: place a LoRA call where its adapter's weights cost the least to bring in.

A replica reports, in ``vllm:lora_requests_info``, the adapters of its running and waiting
requests and ``--max-loras``, the adapters one batch may mix. A call whose adapter runs
there joins the batch at once with its weights in a GPU slot; one whose adapter is only
queued there joins as soon as that adapter's slot is loaded; with a slot free (fewer than
max_loras adapters running or waiting) it loads into it without waiting; otherwise it waits
for an adapter to drain and evicts it, the load time saved is none and the wait unbounded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework.plugin import Scorer, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.types import ReplicaView


@dataclass(slots=True)
class AdapterAffinityParams:
    running_score: float = param(1.0, "the adapter runs there: its weights are in a GPU slot, no load")
    waiting_score: float = param(0.9, "the adapter's requests wait there: its load is already under way")
    free_slot_score: float = param(
        0.5, "a batch slot is free (running + waiting adapters below max_loras): one load, no wait"
    )
    evict_score: float = param(
        0.0, "every slot is taken by other adapters: the call waits for one to drain, then loads"
    )
    unknown_score: float = param(0.5, "the replica reports no LoRA state (max_loras unknown)")

    def validate(self) -> None:
        for name in ("running_score", "waiting_score", "free_slot_score", "evict_score", "unknown_score"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")


def adapter_score(view: ReplicaView, adapter: str, p: AdapterAffinityParams) -> float:
    """How much of the adapter's load time placing on ``view`` saves, in [0, 1]."""
    if adapter in view.lora_running:
        return p.running_score
    if adapter in view.lora_waiting:
        return p.waiting_score
    if view.max_loras <= 0:
        return p.unknown_score
    if len(view.lora_running | view.lora_waiting) < view.max_loras:
        return p.free_slot_score
    return p.evict_score


@register("adapter-affinity")
class AdapterAffinityScorer(Scorer):
    """Warm adapter > queued adapter > free slot > eviction. Calls without an adapter score 0
    everywhere: adding exact zeros leaves every total, and so every placement, as it was."""

    Params = AdapterAffinityParams

    def score(self, state: CycleState) -> np.ndarray:
        adapter = state.request.adapter
        positions = state.sel
        if not adapter:
            return np.zeros(len(positions))
        p: AdapterAffinityParams = self.params
        return np.array([adapter_score(state.view(int(i)), adapter, p) for i in positions], dtype=np.float64)
