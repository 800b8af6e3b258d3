"""What a cluster simulation is given: the replicas of the fleet, their GPUs and outages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from taskplane.sim.gpus import gpu_profile
from taskplane.sim.hints import HintMode
from taskplane.sim.hosttier import TierSpec
from taskplane.sim.lora import LoraSettings
from taskplane.sim.pd import LinkSpec


@dataclass(slots=True)
class ReplicaSpec:
    name: str
    gpu: str = "h100"
    model: str = "llama-3.1-8b"
    kv_blocks: int | None = None  # default: what vLLM would allocate on this GPU for this model
    cost_per_hour_usd: float | None = None  # default: the GPU's list price (taskplane.sim.gpus)
    model_loaded: bool = True
    cold_start_s: float | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    outages: list[tuple[float, float | None]] = field(default_factory=list)  # (down_at_s, up_at_s)
    lora: LoraSettings | None = None  # --enable-lora and its limits (None: the base model only)
    adapters: tuple[str, ...] = ()  # registered at start, as --lora-modules would
    role: str = "both"  # "prefill" (computes prompts for decode replicas), "decode" or "both"
    # several base models on the GPU (vLLM sleep mode, one engine each): ``model`` starts awake,
    # the others of ``models`` asleep at ``sleep_level`` (taskplane.sim.swap_cluster swaps them)
    models: tuple[str, ...] = ()
    sleep_level: int = 1

    def hosted(self) -> tuple[str, ...]:
        """Every base model of the replica, the awake one first."""
        return (self.model, *(m for m in self.models if m != self.model))


@dataclass(slots=True)
class ClusterSpec:
    replicas: list[ReplicaSpec]
    tiers: TierSpec = field(default_factory=TierSpec)  # KV below GPU memory; default none
    # what the SDK tells the policies about the future (taskplane.sim.hints): "author" (an
    # author's fixed estimate), "none", "noisy", or "exact" (the truth: an oracle, a bound)
    hints: HintMode = HintMode.AUTHOR
    link: LinkSpec = field(default_factory=LinkSpec)  # prefill -> decode KV transfers (taskplane.sim.pd)

    def __post_init__(self) -> None:
        self.hints = HintMode.parse(self.hints)

    @classmethod
    def fleet(cls, spec: str = "h100:16", *, model: str = "llama-3.1-8b", kv_blocks: int | None = None,
              hints: str = HintMode.AUTHOR, **kw: Any) -> ClusterSpec:
        """``"h100:8,l40s:8"`` -> 16 replicas named ``h100-0``.. ``l40s-7``."""
        reps: list[ReplicaSpec] = []
        for part in spec.split(","):
            gpu, _, count = part.strip().partition(":")
            gpu_profile(gpu)  # validate
            for i in range(int(count or 1)):
                reps.append(ReplicaSpec(name=f"{gpu}-{i}", gpu=gpu, model=model, kv_blocks=kv_blocks, **kw))
        return cls(reps, hints=HintMode.parse(hints))
