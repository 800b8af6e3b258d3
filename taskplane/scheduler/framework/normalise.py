"""Score normalisation and mask helpers shared by the plugins."""

from __future__ import annotations

import numpy as np


def any_true(mask: np.ndarray) -> bool:
    """``mask.any()``: the same answer at a fraction of the cost on a decision's arrays
    (``ndarray.any`` goes through a generic reduction; counting is a tight loop)."""
    return bool(np.count_nonzero(mask))


def keeps_all(ok: np.ndarray, soft: bool) -> bool:
    """Does a filter with pass mask ``ok`` keep every candidate: all pass, or (``soft``)
    none does? One count instead of a test here and another in ``Scheduler._filter``."""
    kept = np.count_nonzero(ok)
    return kept == len(ok) or (soft and not kept)


def minmax_low_is_better(values: np.ndarray) -> np.ndarray:
    """llm-d style normalisation: (max - v) / (max - min); all equal -> all 1."""
    if values.size == 0:
        return values
    lo = float(values.min())
    hi = float(values.max())
    if hi - lo <= 1e-12:
        return np.ones_like(values)
    return (hi - values) / (hi - lo)


def ratio_low_is_better(values: np.ndarray, floor: float = 1e-9, lowest: float | None = None) -> np.ndarray:
    """min / v: 1 for the best candidate, proportionally less for worse ones.

    Unlike min-max this does not blow a 1 % difference up to the full [0, 1] range.
    ``lowest``: ``values.min()``, when the caller has it already (the same result: the
    smallest of the floored values is the floored smallest value).
    """
    if values.size == 0:
        return values
    v = np.maximum(values, floor)
    best = v.min() if lowest is None else max(lowest, floor)
    return best / v
