"""The default picker (highest total) and round-robin."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework.plugin import Picker, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState


def argmax_seeded(values: np.ndarray, rng: np.random.Generator, tol: float = 1e-9) -> int:
    """Index of the maximum; ties broken by the scheduler's seeded generator."""
    first = int(values.argmax())  # the first maximum (a NaN, if any, as max() would return)
    near = values >= float(values[first]) - tol
    if np.count_nonzero(near) == 1:  # the usual case: one candidate within tol of the best
        return first
    ties = np.flatnonzero(near)
    return int(ties[rng.integers(ties.size)])


def argmin_seeded(values: np.ndarray, rng: np.random.Generator, tol: float = 1e-9) -> int:
    return argmax_seeded(-values, rng, tol)


@dataclass(slots=True)
class MaxScoreParams:
    tie_tolerance: float = param(1e-9, "totals within this of the best count as a tie (broken by the seed)")


@register("max-score")
class MaxScorePicker(Picker):
    """Highest weighted total; ties broken by a generator seeded from the config's seed."""

    Params = MaxScoreParams

    def pick(self, state: CycleState, totals: np.ndarray) -> int:
        return argmax_seeded(totals, state.rng, self.params.tie_tolerance)


@register("round-robin")
class RoundRobinPicker(Picker):
    """Cycles through the pool in order, skipping replicas the filters removed."""

    def __init__(self, params: object, **kw: object) -> None:
        super().__init__(params, **kw)  # type: ignore[arg-type]
        self._next: dict[str, int] = {}  # per model

    def pick(self, state: CycleState, totals: np.ndarray) -> int:
        start = self._next.get(state.model, 0) % max(state.n, 1)
        # first candidate at or after the cursor in pool order, wrapping around
        pos = int(np.searchsorted(state.sel, start))
        if pos >= len(state.sel):
            pos = 0
        self._next[state.model] = int(state.sel[pos]) + 1
        return pos
