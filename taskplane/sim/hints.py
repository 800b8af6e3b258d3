"""What the simulated SDK tells the policies about a task's future: its steps remaining.

A live system knows no task's true length. The SDK sends ``steps_remaining`` from the
author's ``@agent(steps=N)`` (or what the agent's history taught it), so the simulator
offers the same choices:

* ``author`` (the default): the author's one figure per agent (``TaskSpec.expected_steps``)
  minus the calls made, floored at 0 as the SDK does; none for a task without one (a
  replayed chat trace);
* ``none``: no hint at all;
* ``noisy``: the true count off by a random factor (0.5x to 2x, fixed per task): an author
  who guesses per task, badly;
* ``exact``: the true count. An oracle: results with it are an upper bound, not a claim.

Ground truth is used only to score, and, in ``exact`` mode, as the labelled bound.
"""

from __future__ import annotations

import enum
import random

from taskplane.errors import UserError
from taskplane.sim.workloads.base import TaskSpec


class HintMode(enum.StrEnum):
    NONE = "none"
    AUTHOR = "author"
    NOISY = "noisy"
    EXACT = "exact"

    @classmethod
    def parse(cls, value: str) -> HintMode:
        try:
            return cls(value)
        except ValueError:
            raise UserError(f"hints must be one of {', '.join(m.value for m in cls)}, got {value!r}") from None

    @property
    def oracle(self) -> bool:
        return self is HintMode.EXACT


def noise_factor(spec: TaskSpec) -> float:
    """The task's fixed misestimate in ``noisy`` mode: log-uniform in 0.5x..2x."""
    return float(2.0 ** random.Random(spec.seed ^ 0x5EED).uniform(-1.0, 1.0))


def steps_hint(spec: TaskSpec, step: int, mode: HintMode) -> int | None:
    """The steps remaining the SDK would send on call ``step`` of ``spec`` under ``mode``."""
    true_left = len(spec.calls) - step - 1
    if mode is HintMode.EXACT:
        return true_left
    if mode is HintMode.NONE:
        return None
    if mode is HintMode.NOISY:
        total = max(1, round(len(spec.calls) * noise_factor(spec)))
        return max(total - step - 1, 0)
    if spec.expected_steps is None:
        return None
    return max(spec.expected_steps - step - 1, 0)
