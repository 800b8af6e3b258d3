"""Predicted queueing, prefill and decode time per replica, from a per-GPU model that
calibrates itself from observed timings.

The priors are rough figures for an 8B-class model; each GPU generation's prefill rate and
decode step time are then corrected by an exponentially weighted average of
observed/predicted ratios (in log space, so one outlier cannot swing it far). The model never
reads a clock: observations carry their own durations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from taskplane.scheduler.adapter_cost import AdapterCosts
from taskplane.scheduler.types import ReplicaView


@dataclass(slots=True, frozen=True)
class GpuTiming:
    prefill_tokens_per_s: float  # prompt tokens prefilled per second (one request)
    decode_base_ms: float  # one decode step with a batch of one
    decode_per_seq_ms: float  # extra step time per running sequence in the batch
    cold_start_s: float  # loading the weights when the model is not resident


#: Priors (8B-class model, bf16); calibration corrects them per deployment.
GPU_PRIORS: dict[str, GpuTiming] = {
    "b200": GpuTiming(24000.0, 6.0, 0.035, 25.0),
    "h200": GpuTiming(14000.0, 8.0, 0.05, 25.0),
    "h100": GpuTiming(12000.0, 9.0, 0.06, 25.0),
    "a100": GpuTiming(6500.0, 14.0, 0.10, 30.0),
    "l40s": GpuTiming(4500.0, 18.0, 0.14, 30.0),
    "cpu": GpuTiming(250.0, 80.0, 2.0, 20.0),
}
DEFAULT_GPU = "h100"


@dataclass(slots=True)
class Prediction:
    """Per-replica predicted times in milliseconds (arrays aligned with the replicas)."""

    queue_ms: np.ndarray  # prefill work queued ahead of the call, plus any cold start
    prefill_ms: np.ndarray  # the uncached suffix of this prompt
    decode_ms: np.ndarray  # the expected completion at the replica's batch size
    ttft_ms: np.ndarray
    total_ms: np.ndarray
    idle: tuple[Any, ...]  # (cold start ms, decode base ms, per-seq ms, completion tokens)
    _empty: np.ndarray | None = None

    @property
    def empty_total_ms(self) -> np.ndarray:
        """The same call on the replica if it were idle (but as warm). Computed on demand:
        only calls refused or queued need it."""
        if self._empty is None:
            self._empty = _idle_total(self.prefill_ms, *self.idle)
        return self._empty


@dataclass(slots=True)
class OnePrediction:
    """:class:`Prediction` for one replica, as floats."""

    queue_ms: float
    prefill_ms: float
    decode_ms: float
    ttft_ms: float
    total_ms: float
    empty_total_ms: float


def _times(rate: Any, base: Any, per_seq: Any, cold_ms: Any, uncached_tokens: Any, queued_tokens: Any,
           running: Any, completion_tokens: Any) -> tuple[Any, Any, Any, Any, Any]:
    """(queue, prefill, decode, ttft, total) in ms: the one formula behind
    :meth:`LatencyModel.predict` (numpy arrays) and ``predict_scalar`` (floats), so the
    two give the same numbers by construction (with :func:`_idle_total`)."""
    prefill = uncached_tokens / rate * 1000.0
    queue = queued_tokens / rate * 1000.0 + cold_ms
    step = base + per_seq * (running + 1.0)
    decode = completion_tokens * step
    ttft = queue + prefill + base
    total = ttft + decode
    return queue, prefill, decode, ttft, total


def _with_adapter(rate: Any, base: Any, per_seq: Any, cold_ms: Any, load_ms: Any,
                  slow: Any) -> tuple[Any, Any, Any, Any]:
    """The timing of a call with a LoRA adapter: its load joins the cold start (vLLM loads it
    before the step that schedules the call, holding the batch) and every step, the prefill
    included, is ``1 + slow`` times as long."""
    f = 1.0 + slow
    return rate / f, base * f, per_seq * f, cold_ms + load_ms


def _idle_total(prefill: Any, cold_ms: Any, base: Any, per_seq: Any, completion_tokens: Any) -> Any:
    """Total ms of the same call on an idle replica (but as warm)."""
    return cold_ms + prefill + base + completion_tokens * (base + per_seq)


class LatencyModel:
    """Per-GPU timing with online calibration."""

    def __init__(
        self,
        priors: dict[str, GpuTiming] | None = None,
        *,
        alpha: float = 0.1,
        default_completion_tokens: int = 256,
        default_prompt_tokens: int = 1024,
        adapter_costs: AdapterCosts | None = None,
    ) -> None:
        self.priors = dict(GPU_PRIORS if priors is None else priors)
        self.alpha = alpha
        self.default_completion_tokens = default_completion_tokens
        self.default_prompt_tokens = default_prompt_tokens
        self.adapter_costs = adapter_costs or AdapterCosts()  # LoRA load times (adapter_cost.py)
        self._log_prefill: dict[str, float] = {}  # gpu -> log(observed/prior) prefill rate
        self._log_decode: dict[str, float] = {}  # gpu -> log(observed/prior) step time
        self._cold: dict[str, float] = {}
        self._completion: dict[str, float] = {}  # model -> EWMA completion tokens
        self._prompt: dict[str, float] = {}  # model -> EWMA prompt tokens
        self.samples: dict[str, int] = {}
        # per-GPU parameter vectors, indexed by a small code per GPU name
        self._codes: dict[str, int] = {}
        self._params = np.zeros((0, 4))
        self._dirty = True
        self._rows: dict[str, tuple[float, float, float, float]] = {}  # gpu_row's, until recalibrated

    # -- parameters

    def timing(self, gpu: str) -> GpuTiming:
        """The calibrated timing of one GPU generation."""
        prior = self.priors.get(gpu) or self.priors.get(DEFAULT_GPU) or GPU_PRIORS[DEFAULT_GPU]
        return replace(
            prior,
            prefill_tokens_per_s=prior.prefill_tokens_per_s * math.exp(self._log_prefill.get(gpu, 0.0)),
            decode_base_ms=prior.decode_base_ms * math.exp(self._log_decode.get(gpu, 0.0)),
            decode_per_seq_ms=prior.decode_per_seq_ms * math.exp(self._log_decode.get(gpu, 0.0)),
            cold_start_s=self._cold.get(gpu, prior.cold_start_s),
        )

    def _code(self, gpu: str) -> int:
        code = self._codes.get(gpu)
        if code is None:
            code = self._codes[gpu] = len(self._codes)
            self._dirty = True
        return code

    def _row(self, gpu: str) -> tuple[float, float, float, float]:
        """``timing(gpu)``'s four numbers, without building a GpuTiming (this runs on
        every decision after a completion recalibrated the model)."""
        prior = self.priors.get(gpu) or self.priors.get(DEFAULT_GPU) or GPU_PRIORS[DEFAULT_GPU]
        decode = math.exp(self._log_decode.get(gpu, 0.0))
        return (
            prior.prefill_tokens_per_s * math.exp(self._log_prefill.get(gpu, 0.0)),
            prior.decode_base_ms * decode,
            prior.decode_per_seq_ms * decode,
            self._cold.get(gpu, prior.cold_start_s),
        )

    def _param_table(self) -> np.ndarray:
        if self._dirty:
            rows: list[tuple[float, float, float, float]] = [(0.0, 0.0, 0.0, 0.0)] * len(self._codes)
            for gpu, code in self._codes.items():
                rows[code] = self._row(gpu)
            self._params = np.array(rows, dtype=np.float64).reshape(len(rows), 4)
            self._dirty = False
        return self._params

    def gpu_params(self, gpus: list[str]) -> np.ndarray:
        """``(n, 4)`` array: prefill tok/s, decode base ms, decode per-seq ms, cold start s."""
        code = self._codes.get
        codes = [code(g) for g in gpus]
        if None in codes:
            codes = [self._code(g) for g in gpus]
        return self._param_table()[np.asarray(codes, dtype=np.intp)]

    def gpu_row(self, gpu: str) -> tuple[float, float, float, float]:
        """One GPU's ``gpu_params`` row, as floats (the same numbers)."""
        row = self._rows.get(gpu)
        if row is None:
            row = self._rows[gpu] = self._row(gpu)
        return row

    # -- expectations

    def expected_completion_tokens(self, model: str, max_tokens: int) -> float:
        avg = self._completion.get(model, float(self.default_completion_tokens))
        return float(max(1, min(max_tokens, avg)))

    def expected_prompt_tokens(self, model: str) -> float:
        return self._prompt.get(model, float(self.default_prompt_tokens))

    # -- prediction

    def predict(
        self,
        *,
        params: np.ndarray | tuple[float, float, float, float],
        uncached_tokens: np.ndarray,
        queued_tokens: np.ndarray,
        running: np.ndarray,
        loaded: np.ndarray,
        completion_tokens: float,
        adapter: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> Prediction:
        """Vectorised prediction for one call over candidate replicas.

        ``params`` from :meth:`gpu_params`, or one :meth:`gpu_row` when every replica has the
        same GPU (scalars broadcast: fewer array operations, the same results);
        ``queued_tokens``: prefill work ahead of the call; ``adapter``: the call's LoRA
        adapter's (load ms, step slowdown) per replica (``adapter_cost.adapter_terms``),
        None for a base-model call.
        """
        cols: tuple[Any, ...] = params if isinstance(params, tuple) else tuple(params[:, k] for k in range(4))
        rate, base, per_seq, cold_s = cols
        # no cold start anywhere (the usual case): a scalar 0 adds the same as an array of them
        cold_ms = 0.0 if np.count_nonzero(loaded) == len(loaded) else np.where(loaded, 0.0, cold_s * 1000.0)
        if adapter is not None:
            rate, base, per_seq, cold_ms = _with_adapter(rate, base, per_seq, cold_ms, *adapter)
        times = _times(rate, base, per_seq, cold_ms, uncached_tokens, queued_tokens, running, completion_tokens)
        return Prediction(*times, idle=(cold_ms, base, per_seq, completion_tokens))

    @staticmethod
    def predict_scalar(
        params: tuple[float, float, float, float],
        *,
        uncached_tokens: float,
        queued_tokens: float,
        running: float,
        loaded: bool,
        completion_tokens: float,
        adapter: tuple[float, float] | None = None,
    ) -> OnePrediction:
        """:meth:`predict` for one replica (``params`` from :meth:`gpu_row`): the same
        operations in the same order, so the same floats, without numpy's per-call cost."""
        rate, base, per_seq, cold_s = params
        cold_ms = 0.0 if loaded else cold_s * 1000.0
        if adapter is not None:
            rate, base, per_seq, cold_ms = _with_adapter(rate, base, per_seq, cold_ms, *adapter)
        times = _times(rate, base, per_seq, cold_ms, uncached_tokens, queued_tokens, running, completion_tokens)
        return OnePrediction(*times, _idle_total(times[1], cold_ms, base, per_seq, completion_tokens))

    def queued_tokens(self, replica: ReplicaView) -> float:
        """Prefill work ahead of a new call on ``replica``."""
        return float(max(replica.inflight_prefill_tokens, replica.num_waiting * self.expected_prompt_tokens(replica.model)))

    # -- calibration

    def _ewma(self, table: dict[str, float], key: str, value: float) -> None:
        old = table.get(key)
        table[key] = value if old is None else old + self.alpha * (value - old)

    def observe(
        self,
        gpu: str,
        *,
        model: str | None = None,
        prefill_tokens: float = 0.0,
        ttft_s: float | None = None,
        completion_tokens: int = 0,
        decode_s: float | None = None,
        batch_size: float = 1.0,
        cold_start_s: float | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        """Fold one observed call into the model.

        ``prefill_tokens``: tokens the replica had to prefill before this call's first token
        (the uncached suffix plus the work queued ahead of it); ``ttft_s`` excludes any cold
        start, which is reported separately in ``cold_start_s``.
        """
        prior = self.priors.get(gpu) or self.priors.get(DEFAULT_GPU) or GPU_PRIORS[DEFAULT_GPU]
        self.samples[gpu] = self.samples.get(gpu, 0) + 1
        if ttft_s is not None and ttft_s > 1e-4 and prefill_tokens >= 64:
            # the fixed first-step overhead is not prefill work
            prefill_s = max(ttft_s - self.gpu_row(gpu)[1] / 1000.0, 1e-4)
            ratio = (prefill_tokens / prefill_s) / prior.prefill_tokens_per_s
            self._ewma(self._log_prefill, gpu, math.log(min(max(ratio, 1e-3), 1e3)))
        if decode_s is not None and decode_s > 0 and completion_tokens > 1:
            step_ms = decode_s * 1000.0 / (completion_tokens - 1)
            prior_step = prior.decode_base_ms + prior.decode_per_seq_ms * max(batch_size, 1.0)
            ratio = step_ms / prior_step
            self._ewma(self._log_decode, gpu, math.log(min(max(ratio, 1e-3), 1e3)))
        if cold_start_s is not None and cold_start_s > 0:
            self._ewma(self._cold, gpu, cold_start_s)
        if model is not None:
            if completion_tokens > 0:
                self._ewma(self._completion, model, float(completion_tokens))
            if prompt_tokens:
                self._ewma(self._prompt, model, float(prompt_tokens))
        self._dirty = True
        self._rows.clear()
