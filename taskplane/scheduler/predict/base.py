"""The prediction value type and the running statistics the models share."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Prediction:
    """A predicted quantity, how sure the model is (0..1), and what it rests on.

    ``source``: ``learned`` (history), ``hint`` (the SDK author's figure), ``prior`` (a
    default, confidence 0).
    """

    value: float
    confidence: float
    samples: int = 0
    source: str = "prior"
    spread: float = 0.0  # a standard deviation where the model has one

    def usable(self, min_confidence: float) -> bool:
        """Whether a decision needing ``min_confidence`` may act on this prediction."""
        return self.confidence >= min_confidence


def evidence(n: float, half: float) -> float:
    """Confidence from ``n`` samples: 0 with none, 0.5 at ``half``, towards 1 with more."""
    if n <= 0:
        return 0.0
    return n / (n + max(half, 1e-9))


@dataclass(slots=True)
class Running:
    """Mean and variance of a stream (Welford), in constant space."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else 0.0
