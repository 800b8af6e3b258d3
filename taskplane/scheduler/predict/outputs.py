"""How many tokens a call will generate, learned per agent and tool.

A client's ``max_tokens`` is a cap, not a forecast; the learned mean (never above the
cap) is what the latency and memory estimates should charge.
"""

from __future__ import annotations

from taskplane.scheduler.predict.base import Prediction, Running, evidence

_ANY = "*"


class OutputModel:
    """Output lengths per (agent, tool), else per agent, else over all calls."""

    def __init__(self, *, min_samples: int = 5, half: float = 10.0) -> None:
        self.min_samples = min_samples
        self.half = half
        self._stats: dict[tuple[str, str | None], Running] = {}

    def observe(self, agent: str, tool: str | None, tokens: int) -> None:
        for key in ((agent, tool), (agent, _ANY), (_ANY, _ANY)):
            self._stats.setdefault(key, Running()).add(float(tokens))

    def predict(self, agent: str, tool: str | None, cap: int | None = None) -> Prediction:
        """Expected output tokens (at most ``cap``); with no history, the cap at confidence 0."""
        for key in ((agent, tool), (agent, _ANY), (_ANY, _ANY)):
            stats = self._stats.get(key)
            if stats is not None and stats.n >= self.min_samples:
                value = stats.mean if cap is None else min(stats.mean, float(cap))
                return Prediction(value, evidence(stats.n, self.half), stats.n, "learned", stats.std)
        return Prediction(float(cap or 0), 0.0, 0, "prior")
