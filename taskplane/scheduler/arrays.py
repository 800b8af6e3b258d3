"""Numbers as 0-d arrays for a decision's numpy arithmetic.

Numpy converts a Python number operand on every operation, which costs about as much as
the arithmetic on a 500-replica array; a 0-d float64 array operand gives the same values
without that conversion. Shared by the cycle state, the latency model and the scorers.
"""

from __future__ import annotations

import numpy as np


def num(x: float) -> np.ndarray:
    """``x`` as a 0-d float64 array, to combine with the pool's arrays."""
    return np.array(x, dtype=np.float64)


def constant(x: float) -> np.ndarray:
    """``num(x)``, read-only: a constant shared by every decision."""
    arr = num(x)
    arr.flags.writeable = False
    return arr


ZERO, ONE = constant(0.0), constant(1.0)
