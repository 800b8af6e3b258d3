"""The time to bring a call's LoRA adapter onto a replica, as the latency model adds it to
the call's predicted TTFT there.

vLLM loads an adapter synchronously in the model runner when the first step that schedules
one of its requests finds it in no GPU slot: a host-to-GPU copy when its weights are in the
CPU cache (``--max-cpu-loras``), a disk read first when they are not. Every step that mixes
one more distinct adapter is also slower (the punica/SGMV kernels' work grows with them).

What a live picker knows of where an adapter is: ``vllm:lora_requests_info`` names the
adapters of a replica's running and waiting requests (their weights are on GPU, or their
load is under way) and ``max_lora``; nothing exports the GPU slots or host copies of
adapters without requests, so a picker that mirrors its own placements (the
``adapter-residency`` scorer) offers its guess through :class:`AdapterWarmth`. Without
one, an adapter that neither runs nor waits on a replica is taken to be cold there.
The defaults match the simulator's LoRA engine (``taskplane/sim/lora.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from taskplane.scheduler.types import ReplicaView

Tier = Literal["gpu", "host"]


@dataclass(frozen=True, slots=True)
class AdapterCosts:
    """Load times and batch slowdown of LoRA adapters (``scheduler.adapter_costs`` in the config)."""

    disk_load_s: float = 0.25  # reading an adapter's weights from disk into host memory
    gpu_load_s: float = 0.005  # copying them from host memory into a GPU slot
    step_overhead: float = 0.05  # a step with any LoRA request is this much slower ...
    per_adapter_overhead: float = 0.02  # ... plus this per distinct adapter it mixes

    def __post_init__(self) -> None:
        if min(self.disk_load_s, self.gpu_load_s, self.step_overhead, self.per_adapter_overhead) < 0:
            raise ValueError("adapter costs must be non-negative")


class AdapterWarmth(Protocol):
    """Where a picker believes an adapter's weights are on a replica."""

    def where(self, replica: str, adapter: str) -> Tier | None:
        """``"gpu"`` (a GPU slot), ``"host"`` (the CPU cache) or None (not known to be there)."""
        ...


def adapter_term(view: ReplicaView, adapter: str, costs: AdapterCosts,
                 warmth: AdapterWarmth | None) -> tuple[float, float]:
    """(load ms, step slowdown fraction) of a call of ``adapter`` placed on ``view``.

    The load is 0 when the adapter runs or waits there or is believed in a GPU slot, the
    host-to-GPU copy when believed in the CPU cache, else the disk read plus the copy. The
    slowdown is what one more distinct adapter adds to each step of the batch (with the
    fixed LoRA overhead when no adapter is in the batch yet); none when it already is.
    A replica that reports no LoRA state (``max_loras`` 0) costs nothing: nothing is known.
    """
    if view.max_loras <= 0:
        return 0.0, 0.0
    if adapter in view.lora_running or adapter in view.lora_waiting:
        return 0.0, _slowdown(view, adapter, costs)
    tier = warmth.where(view.name, adapter) if warmth is not None else None
    if tier == "gpu":
        load_s = 0.0
    elif tier == "host":
        load_s = costs.gpu_load_s
    else:
        load_s = costs.disk_load_s + costs.gpu_load_s
    return load_s * 1000.0, _slowdown(view, adapter, costs)


def _slowdown(view: ReplicaView, adapter: str, costs: AdapterCosts) -> float:
    """The step-time fraction the call's batch runs slower there: the LoRA overhead plus one
    share per distinct adapter it mixes, the call's own included."""
    mixed = view.lora_running | view.lora_waiting
    return costs.step_overhead + costs.per_adapter_overhead * (len(mixed) + (adapter not in mixed))


def adapter_terms(views: list[ReplicaView], adapter: str, costs: AdapterCosts,
                  warmth: AdapterWarmth | None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`adapter_term` over replicas, as two arrays aligned with ``views``."""
    terms = [adapter_term(v, adapter, costs, warmth) for v in views]
    load = np.fromiter((t[0] for t in terms), dtype=np.float64, count=len(terms))
    slow = np.fromiter((t[1] for t in terms), dtype=np.float64, count=len(terms))
    return load, slow
