"""How many calls a task (or a conversation) makes, learned per tenant and agent.

From the totals of finished tasks, the model answers for a task at call ``step`` (0-based,
so it has made at least ``step + 1`` calls): the calls still to come, conditioned on having
come this far, and the chance that this call is its last (the hazard). An SDK hint (the
author's ``@agent(steps=N)``, sent as steps remaining) competes with the learned answer;
how far the author's totals were from the real ones, per agent, sets how much it is trusted.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from taskplane.scheduler.predict.base import Prediction, Running, evidence


@dataclass(slots=True)
class _Totals:
    counts: Counter[int] = field(default_factory=Counter)
    n: int = 0

    def add(self, total: int, k: int = 1) -> None:
        self.counts[total] += k
        self.n += k
        if self.counts[total] <= 0:
            del self.counts[total]

    def beyond(self, step: int) -> tuple[int, float, float, float]:
        """(survivors, mean and std of calls left after this one, P(this is the last)) for
        the tasks that made more than ``step`` calls."""
        surv = last = 0
        s = s2 = 0.0
        for total, c in self.counts.items():
            if total > step:
                surv += c
                left = total - step - 1
                s += c * left
                s2 += c * left * left
                if left == 0:
                    last += c
        if surv == 0:
            return 0, 0.0, 0.0, 0.0
        mean = s / surv
        return surv, mean, math.sqrt(max(s2 / surv - mean * mean, 0.0)), last / surv


class StepsModel:
    """Task lengths per (tenant, agent), else per agent; author hints scored per agent.

    ``min_samples``: tasks that got past this step before a level answers; ``half``: the
    samples at which a learned answer's confidence reaches 0.5; ``hint_prior``: the trust
    in an author's hint before any of theirs was checked.
    """

    def __init__(self, *, min_samples: int = 5, half: float = 10.0, hint_prior: float = 0.5) -> None:
        self.min_samples = min_samples
        self.half = half
        self.hint_prior = hint_prior
        self._totals: dict[tuple[str, str], _Totals] = {}
        self._hint_error: dict[str, Running] = {}

    # -- learning

    def observe_total(self, agent: str, tenant: str, total: int, *, weight: int = 1) -> None:
        """A task of ``agent`` for ``tenant`` ended after ``total`` calls (``weight=-1``
        takes back a total recorded too early: the conversation came back)."""
        if total < 1:
            return
        for key in ((tenant, agent), ("*", agent)):
            self._totals.setdefault(key, _Totals()).add(total, weight)

    def observe_hint(self, agent: str, hinted_total: int, total: int) -> None:
        """How far the author's total was from the task's real one."""
        self._hint_error.setdefault(agent, Running()).add(abs(hinted_total - total) / max(total, 1))

    def hint_confidence(self, agent: str) -> float:
        """Trust in this agent's hints: the prior, moving to 1 - mean relative error with evidence."""
        err = self._hint_error.get(agent)
        if err is None:
            return self.hint_prior
        w = evidence(err.n, 5.0)
        return (1.0 - w) * self.hint_prior + w * max(0.0, 1.0 - err.mean)

    # -- answers

    def _learned(self, agent: str, tenant: str, step: int) -> tuple[int, float, float, float] | None:
        for key in ((tenant, agent), ("*", agent)):
            totals = self._totals.get(key)
            if totals is None:
                continue
            got = totals.beyond(step)
            if got[0] >= self.min_samples:
                return got
        return None

    def steps_left(self, agent: str, tenant: str, step: int, hint: int | None = None) -> Prediction:
        """Calls still to come after call ``step``; ``hint``: the SDK's steps remaining."""
        learned = self._learned(agent, tenant, step)
        best = Prediction(0.0, 0.0) if learned is None else Prediction(
            learned[1], evidence(learned[0], self.half) / (1.0 + learned[2] / (learned[1] + 1.0)),
            learned[0], "learned", learned[2])
        if hint is not None:
            trust = self.hint_confidence(agent)
            if trust >= best.confidence:
                return Prediction(float(max(hint, 0)), trust, 0, "hint")
        return best

    def session_end(self, agent: str, tenant: str, step: int, hint: int | None = None) -> Prediction:
        """The probability that call ``step`` is the task's last."""
        learned = self._learned(agent, tenant, step)
        best = Prediction(0.0, 0.0) if learned is None else Prediction(
            learned[3], evidence(learned[0], self.half), learned[0], "learned")
        if hint is not None:
            trust = self.hint_confidence(agent)
            if trust >= best.confidence:
                return Prediction(1.0 if hint <= 0 else 0.0, trust, 0, "hint")
        return best
