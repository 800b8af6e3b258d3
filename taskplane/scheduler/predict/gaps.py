"""How long a task stays in a tool between two calls, learned per agent and tool."""

from __future__ import annotations

from taskplane.scheduler.predict.base import Prediction, Running, evidence


class GapModel:
    """Tool-gap lengths: the tool's own history, else the agent's, else a default.

    ``min_samples``: the history a level needs before it answers; ``half``: the samples at
    which its confidence reaches 0.5.
    """

    def __init__(self, *, default_s: float = 2.0, min_samples: int = 3, half: float = 5.0) -> None:
        self.default_s = default_s
        self.min_samples = min_samples
        self.half = half
        self._by_tool: dict[tuple[str, str | None], Running] = {}
        self._by_agent: dict[str, Running] = {}

    def observe(self, agent: str, tool: str | None, gap_s: float) -> None:
        """A tool gap that just ended."""
        self._by_tool.setdefault((agent, tool), Running()).add(gap_s)
        self._by_agent.setdefault(agent, Running()).add(gap_s)

    def predict(self, agent: str, tool: str | None) -> Prediction:
        """The gap's mean (``value``) and standard deviation (``spread``)."""
        for source, stats in (("learned", self._by_tool.get((agent, tool))), ("learned", self._by_agent.get(agent))):
            if stats is not None and stats.n >= self.min_samples:
                return Prediction(stats.mean, evidence(stats.n, self.half), stats.n, source, stats.std)
        return Prediction(self.default_s, 0.0, 0, "prior", self.default_s)
