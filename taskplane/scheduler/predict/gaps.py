"""How long a task stays in a tool between two calls (or a user between two turns),
learned per agent and tool: mean and spread, and the distribution itself (how likely a
gap is to last longer than some time), from a bounded sample of the gaps seen."""

from __future__ import annotations

import bisect

from taskplane.scheduler.predict.base import Prediction, Running, evidence


class _Sample:
    """Up to ``cap`` gaps, sorted; past the cap a new gap replaces one spread over the sample."""

    __slots__ = ("cap", "seen", "xs")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.seen = 0
        self.xs: list[float] = []

    def add(self, x: float) -> None:
        self.seen += 1
        if len(self.xs) >= self.cap:
            del self.xs[(self.seen * 2654435761) % len(self.xs)]
        bisect.insort(self.xs, x)

    def above(self, t: float) -> float:
        return (len(self.xs) - bisect.bisect_right(self.xs, t)) / len(self.xs)

    def quantile(self, q: float) -> float:
        i = min(max(int(q * len(self.xs)), 0), len(self.xs) - 1)
        return self.xs[i]


class GapModel:
    """Tool-gap lengths: the tool's own history, else the agent's, else a default.

    ``min_samples``: the history a level needs before it answers; ``half``: the samples at
    which its confidence reaches 0.5; ``cap``: gaps kept per level for the distribution.
    """

    def __init__(self, *, default_s: float = 2.0, min_samples: int = 3, half: float = 5.0, cap: int = 2048) -> None:
        self.default_s = default_s
        self.min_samples = min_samples
        self.half = half
        self.cap = cap
        self._by_tool: dict[tuple[str, str | None], Running] = {}
        self._by_agent: dict[str, Running] = {}
        self._samples: dict[tuple[str, str | None], _Sample] = {}

    def observe(self, agent: str, tool: str | None, gap_s: float) -> None:
        """A tool gap that just ended."""
        self._by_tool.setdefault((agent, tool), Running()).add(gap_s)
        self._by_agent.setdefault(agent, Running()).add(gap_s)
        for key in ((agent, tool), (agent, "*")):
            sample = self._samples.get(key)
            if sample is None:
                sample = self._samples[key] = _Sample(self.cap)
            sample.add(gap_s)

    def predict(self, agent: str, tool: str | None) -> Prediction:
        """The gap's mean (``value``) and standard deviation (``spread``)."""
        for source, stats in (("learned", self._by_tool.get((agent, tool))), ("learned", self._by_agent.get(agent))):
            if stats is not None and stats.n >= self.min_samples:
                return Prediction(stats.mean, evidence(stats.n, self.half), stats.n, source, stats.std)
        return Prediction(self.default_s, 0.0, 0, "prior", self.default_s)

    def _sample(self, agent: str, tool: str | None) -> _Sample | None:
        for key in ((agent, tool), (agent, "*")):
            sample = self._samples.get(key)
            if sample is not None and len(sample.xs) >= self.min_samples:
                return sample
        return None

    def longer_than(self, agent: str, tool: str | None, t: float) -> Prediction:
        """The chance that a gap lasts longer than ``t`` seconds."""
        sample = self._sample(agent, tool)
        if sample is None:
            return Prediction(1.0, 0.0)
        return Prediction(sample.above(t), evidence(len(sample.xs), self.half), len(sample.xs), "learned")

    def quantile(self, agent: str, tool: str | None, q: float) -> Prediction:
        """The gap length that a share ``q`` of gaps does not exceed."""
        sample = self._sample(agent, tool)
        if sample is None:
            return Prediction(self.default_s, 0.0)
        return Prediction(sample.quantile(q), evidence(len(sample.xs), self.half), len(sample.xs), "learned")
