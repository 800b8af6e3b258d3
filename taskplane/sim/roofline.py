"""How long an engine step takes: the roofline of :mod:`taskplane.sim.gpus`, per step and
for a stretch of pure decode steps in closed form.

A step costs ``overhead + max(weights read, GEMMs) + decode KV reads + prefill
attention``, all times a slow-down factor (fault injection). In a stretch of pure decode
steps of ``d`` requests the context grows by ``d`` a step, so the stretch's duration is
an arithmetic series (:func:`decode_span`) and the number of steps that start within a
given time is the root of a quadratic (:func:`decode_steps_by`): the engine jumps over
such a stretch without visiting each step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from taskplane.sim.gpus import GpuProfile, ModelProfile


@dataclass(frozen=True, slots=True)
class StepCosts:
    """The roofline's terms for one GPU generation and model, in seconds."""

    overhead: float  # scheduler + sampling + launch, per step
    weights: float  # reading the weights once (the floor of every step)
    per_token: float  # GEMM time per token in the batch
    kv_read: float  # reading one context token's KV
    attn: float  # attention per (query x context) pair

    @classmethod
    def of(cls, gpu: GpuProfile, model: ModelProfile) -> StepCosts:
        flops = gpu.peak_tflops * 1e12 * gpu.flops_efficiency
        bw = gpu.mem_bw_gbs * 1e9 * gpu.bw_efficiency
        return cls(
            overhead=gpu.step_overhead_s,
            weights=model.weight_bytes / bw,
            per_token=model.flops_per_token / flops,
            kv_read=model.kv_bytes_per_token / bw,
            attn=model.attn_flops_per_token_ctx / flops,
        )

    def step(self, prompt_tokens: int, decoders: int, decode_ctx: int, attn_pairs: float, slow: float) -> float:
        """One step: ``prompt_tokens`` of prompt chunks (``attn_pairs`` query x context
        pairs among them) and one token for each of ``decoders`` requests reading
        ``decode_ctx`` context tokens in all."""
        return (
            self.overhead
            + max(self.weights, (prompt_tokens + decoders) * self.per_token)
            + decode_ctx * self.kv_read
            + attn_pairs * self.attn
        ) * slow

    def decode_base(self, decoders: int) -> float:
        """A pure decode step's cost besides reading the KV."""
        return self.overhead + max(self.weights, decoders * self.per_token)


def decode_span(k: int, a: float, c0: int, d: int, t_kv: float, slow: float) -> float:
    """Duration of ``k`` pure decode steps of ``d`` requests with context ``c0`` at the first
    (it grows by ``d`` a step) and per-step cost ``a`` besides reading the KV."""
    return (k * a + t_kv * (k * c0 + d * k * (k - 1) / 2)) * slow


def decode_steps_by(span: float, strict: bool, k_max: int, a: float, c0: int, d: int, t_kv: float,
                    slow: float) -> tuple[int, float]:
    """How many pure decode steps (1..``k_max``) start within ``span`` (strictly before its
    end with ``strict``), and their duration (see :func:`decode_span`)."""

    def starts(i: int) -> bool:  # does step i (0-based) start by now?
        di = decode_span(i, a, c0, d, t_kv, slow)
        return di < span if strict else di <= span

    # span(i) = A i^2 + B i is increasing: solve span(x) = span, then fix rounding
    qa = t_kv * d / 2 * slow
    qb = (a + t_kv * (c0 - d / 2)) * slow
    if qa > 0:
        x = (-qb + math.sqrt(qb * qb + 4 * qa * span)) / (2 * qa)
    else:
        x = span / qb
    k = min(max(int(x) + 1, 1), k_max)  # steps 0..floor(x) start by now
    while k < k_max and starts(k):
        k += 1
    while k > 1 and not starts(k - 1):
        k -= 1
    return k, decode_span(k, a, c0, d, t_kv, slow)


def decode_run(span: float, strict: bool, k_max: int, a: float, c0: int, d: int, t_kv: float,
               slow: float) -> tuple[int, float]:
    """The pure decode steps up to the next completion (``k_max`` of them) that start within
    ``span``, and their duration: all of them when the last does, else at least the first
    (the one starting now) and those after it that start by then."""
    last = decode_span(k_max - 1, a, c0, d, t_kv, slow)
    if last < span if strict else last <= span:  # the last step starts by now: through the completion
        return k_max, decode_span(k_max, a, c0, d, t_kv, slow)
    dur = decode_span(1, a, c0, d, t_kv, slow)  # the usual: only the step starting now (after a completion)
    if dur < span if strict else dur <= span:  # step 1 starts by now too
        return decode_steps_by(span, strict, k_max - 1, a, c0, d, t_kv, slow)
    return 1, dur
