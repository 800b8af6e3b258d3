"""A model swap priced into the latency prediction: several base models sharing a replica.

A replica may host several base models, one awake (vLLM sleep mode: one engine per model,
the others asleep with their weights in host memory at level 1 or on disk at level 2). A
call of an asleep model waits for a swap: the awake engine's calls in flight finish (vLLM's
``/sleep?mode=wait``), it sleeps, the call's engine wakes, and the KV cache starts empty.
Pricing that wait in the prediction every filter, scorer and admission already reads
(queue, TTFT, total) is what makes a warm replica win whenever it can serve and a swap
happen only when it pays; :mod:`taskplane.scheduler.filters.swap` adds the demand rule.

Only what a live control plane knows goes in: the sleep state gauge (which models are
asleep, at which level), the replica's running calls and the tokens they have left to
generate (its own in-flight count), when a swap it started should be done, and how long
swaps have taken (:class:`SwapCosts`, priors corrected by observed swaps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from taskplane.scheduler.latency import Prediction


@dataclass(slots=True)
class SwapCosts:
    """Seconds a swap takes (sleep the awake engine, wake the other) by the asleep one's level.

    The priors are an 8B-class model on an H100 (level 1: the weights cross PCIe both ways,
    about 0.5 s + 1.4 s; level 2: reloaded from disk, about 9 s); :meth:`observe` moves them
    towards the swaps the fleet measures (EWMA)."""

    level1_s: float = 2.0
    level2_s: float = 10.0
    alpha: float = 0.2
    seen: dict[int, float] = field(default_factory=dict)

    def seconds(self, level: int) -> float:
        """The expected swap time to wake a model asleep at ``level``."""
        got = self.seen.get(level)
        if got is not None:
            return got
        return self.level2_s if level >= 2 else self.level1_s

    def observe(self, level: int, seconds: float) -> None:
        """A swap to a model asleep at ``level`` took ``seconds``."""
        old = self.seen.get(level)
        self.seen[level] = seconds if old is None else old + self.alpha * (seconds - old)


def drain_ms(running: np.ndarray, inflight_decode: np.ndarray, base: Any, per_seq: Any) -> np.ndarray:
    """Time for a replica's calls in flight to finish: their mean tokens left at the
    replica's step time (the queued prefill is in the prediction's queue already)."""
    step = base + per_seq * running
    return np.where(running > 0, inflight_decode / np.maximum(running, 1.0) * step, 0.0)


def swap_priced(pred: Prediction, *, asleep: np.ndarray | None, level: np.ndarray, ready_in_s: np.ndarray,
                running: np.ndarray, inflight_decode: np.ndarray, costs: SwapCosts) -> Prediction:
    """``pred`` with each swap's wait added to queue, TTFT and total: on replicas hosting the
    model asleep (drain + swap) and on replicas whose swap to it is under way (drain + what
    is left of the swap). An idle replica's total (``empty_total_ms``) keeps the swap."""
    pending = ready_in_s > 0.0
    if asleep is None and not pending.any():
        return pred
    swapping = pending if asleep is None else asleep | pending
    wake_s = np.where(level >= 2, costs.seconds(2), costs.seconds(1))
    wake_ms = np.where(pending, ready_in_s * 1000.0, 0.0)
    if asleep is not None:
        wake_ms = np.where(asleep, wake_s * 1000.0, wake_ms)
    cold_ms, base, per_seq, completion = pred.idle
    add = wake_ms + np.where(swapping, drain_ms(running, inflight_decode, base, per_seq), 0.0)
    return Prediction(pred.queue_ms + add, pred.prefill_ms, pred.decode_ms, pred.ttft_ms + add, pred.total_ms + add,
                      idle=(cold_ms + wake_ms, base, per_seq, completion))
