"""Timing and price constants per GPU generation and per model, with their sources.

The engine model is a roofline: a step of continuous batching costs

    overhead
    + max(weights / bandwidth,  (prefill + decode tokens) * 2 * params / flops)   # GEMMs
    + decode context tokens * kv_bytes_per_token / bandwidth                       # attention reads
    + prefill tokens * attended context * attn_flops_per_token_ctx / flops         # prefill attention

with ``flops`` and ``bandwidth`` the datasheet peaks times an achieved fraction.

Sources (datasheet peaks, dense BF16, per GPU):
- H100 SXM5 80 GB: 989 TFLOPS, HBM3 3.35 TB/s (NVIDIA H100 Tensor Core GPU datasheet).
- H200 SXM 141 GB: 989 TFLOPS, HBM3e 4.8 TB/s (NVIDIA H200 datasheet).
- B200 (HGX B200, per GPU) 180 GB: 2.25 PFLOPS dense BF16, HBM3e 8 TB/s (NVIDIA
  Blackwell / HGX B200 datasheet; the 4.5 PFLOPS figure is with sparsity).
- L40S 48 GB: 362 TFLOPS dense BF16 (733 with sparsity), GDDR6 864 GB/s (NVIDIA L40S datasheet).
- A100 SXM4 80 GB: 312 TFLOPS BF16, HBM2e 2.04 TB/s (NVIDIA A100 datasheet).
- cpu: a 2-socket server class CPU with AMX/AVX-512: ~4 TFLOPS BF16 and ~300 GB/s of
  DRAM bandwidth (order of magnitude of Intel Sapphire Rapids figures); a stand-in for
  the ``vllm-cpu`` tier, not a calibrated model.

Achieved fractions (assumptions, stated so they can be argued with): 55% of peak FLOPS
in prefill GEMMs and 75% of peak bandwidth in decode are typical of vLLM on Hopper;
with them an 8B model prefills ~30k tokens/s on an H100 and decodes a single stream at
~7 ms per token, in line with published vLLM numbers for Llama-3-8B on H100
(roughly 20-35k prefill tokens/s, 6-9 ms time per output token at batch 1).

Model shapes (from each model's config.json): Llama-3.1-8B has 8.03e9 parameters, 32
layers, 32 query heads and 8 KV heads of dimension 128, so its BF16 KV cache holds
2 * 32 * 8 * 128 * 2 B = 128 KiB per token. Llama-3.2-1B: 1.24e9 parameters, 16 layers,
32 query / 8 KV heads of dimension 64 -> 32 KiB per token. Llama-3.1-70B: 70.6e9, 80
layers, 64 / 8 heads of 128 -> 320 KiB per token (modelled as if on one GPU of the
given generation with enough memory; use it for relative comparisons only).

Prices per GPU-hour are round figures inside the 2025 range of on-demand cloud list
prices (hyperscalers higher, GPU clouds lower); every replica can override its price.

Cold start: weights / 2 GB/s (local NVMe) + 10 s of engine start (CUDA graphs, warm-up).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str
    peak_tflops: float  # dense BF16
    mem_bw_gbs: float  # GB/s
    memory_gb: float
    price_per_hour_usd: float
    flops_efficiency: float = 0.55
    bw_efficiency: float = 0.75
    step_overhead_s: float = 0.0008  # scheduler + sampling + launch overhead per step
    load_bw_gbs: float = 2.0  # weight load bandwidth for cold starts


@dataclass(frozen=True, slots=True)
class ModelProfile:
    name: str
    params: float
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def flops_per_token(self) -> float:
        """GEMM FLOPs per token (2 per parameter)."""
        return 2.0 * self.params

    @property
    def attn_flops_per_token_ctx(self) -> float:
        """Attention FLOPs per (query token x attended context token): QK^T and PV."""
        return 4.0 * self.n_layers * self.n_heads * self.head_dim


GPUS: dict[str, GpuProfile] = {
    "h100": GpuProfile("h100", peak_tflops=989, mem_bw_gbs=3350, memory_gb=80, price_per_hour_usd=2.50),
    "h200": GpuProfile("h200", peak_tflops=989, mem_bw_gbs=4800, memory_gb=141, price_per_hour_usd=3.50),
    "b200": GpuProfile("b200", peak_tflops=2250, mem_bw_gbs=8000, memory_gb=180, price_per_hour_usd=5.50),
    "l40s": GpuProfile("l40s", peak_tflops=362, mem_bw_gbs=864, memory_gb=48, price_per_hour_usd=1.00),
    "a100": GpuProfile("a100", peak_tflops=312, mem_bw_gbs=2039, memory_gb=80, price_per_hour_usd=1.60),
    "cpu": GpuProfile(
        "cpu", peak_tflops=4, mem_bw_gbs=300, memory_gb=256, price_per_hour_usd=0.40,
        flops_efficiency=0.5, bw_efficiency=0.6, step_overhead_s=0.003,
    ),
}

MODELS: dict[str, ModelProfile] = {
    "llama-3.1-8b": ModelProfile("llama-3.1-8b", 8.03e9, 32, 32, 8, 128),
    "llama-3.2-1b": ModelProfile("llama-3.2-1b", 1.24e9, 16, 32, 8, 64),
    "llama-3.1-70b": ModelProfile("llama-3.1-70b", 70.6e9, 80, 64, 8, 128),
}

DEFAULT_MODEL = "llama-3.1-8b"
ENGINE_START_S = 10.0
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization


def gpu_profile(name: str) -> GpuProfile:
    """The profile of a GPU generation; raises ValueError naming the known ones."""
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown GPU generation {name!r}; known: {', '.join(GPUS)}") from None


def model_profile(name: str) -> ModelProfile:
    """The shape of a model; an unknown name is modelled as Llama-3.1-8B (the common case)."""
    key = name.lower()
    for known, prof in MODELS.items():
        if known in key:
            return prof
    return MODELS[DEFAULT_MODEL]


def default_kv_blocks(gpu: str, model: str, block_size: int) -> int:
    """KV blocks vLLM would allocate: memory * 0.9 - weights, over the block's bytes."""
    g, m = gpu_profile(gpu), model_profile(model)
    free = g.memory_gb * 1e9 * GPU_MEMORY_UTILIZATION - m.weight_bytes * 1.05  # + activations
    return max(16, int(free // (m.kv_bytes_per_token * block_size)))


def default_cold_start_s(gpu: str, model: str) -> float:
    g, m = gpu_profile(gpu), model_profile(model)
    return m.weight_bytes / (g.load_bw_gbs * 1e9) + ENGINE_START_S
