"""KV lifetimes decided by the workflow: what happens to a session's KV while its task is in
a tool.

Only the control plane knows, from the workflow, that a session is in a tool, which tool,
how long that tool usually takes (learned per agent and tool from the gaps seen so far),
how many steps the task has left and how much deadline slack it has. When a call ends and
its task goes into a tool (the SDK's "in a tool" hint), :meth:`LifetimePlanner.plan` picks:

* ``KEEP``: leave the session on GPU (a short gap on a replica with room: LRU keeps it);
* ``HOST``: let it go to the host tier (it is written through already) and *prefetch* it
  back to GPU shortly before the next call is expected, so that call neither recomputes nor
  waits for the load;
* ``DROP``: the task has no step left, so its private blocks leave the GPU at once, making
  room for sessions that will come back.

Pure: no engine, no clock; the simulator (and, where vLLM allows it, the gateway) carries
the plan out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from taskplane.scheduler.predict import GapModel, Predictor


class Lifetime(enum.StrEnum):
    KEEP = "keep"
    HOST = "host"
    DROP = "drop"


# ToolHint and LifetimePlan are built at every call end: plain slots, since a frozen
# dataclass's construction costs about twice as much (4.7 against 2.9 us per plan here)
@dataclass(slots=True)
class ToolHint:
    """What the workflow says when a call ends: the task goes into ``tool`` (None: it ends)."""

    agent: str
    tool: str | None
    steps_left: int
    slack_s: float | None = None  # deadline minus now, if the task has one


@dataclass(slots=True)
class LifetimePlan:
    action: Lifetime
    prefetch_in_s: float | None = None  # from now; None: no prefetch
    expected_gap_s: float = 0.0


class LifetimePlanner:
    """Per-session KV lifetimes across tool gaps, from the prediction layer's gap model.

    ``predictor``: where gaps (and session ends) are learned. A conversation that never
    says it is over has its KV let go (:meth:`let_go_in`) once the predicted chance that it
    comes back has fallen below ``return_chance``, if that prediction has confidence
    ``min_confidence`` or more (else its KV is left to the cache, as with no context)."""

    def __init__(self, *, keep_gap_s: float = 0.5, kv_pressure: float = 0.9, lead_std: float = 1.0,
                 default_gap_s: float = 2.0, min_samples: int = 3, predictor: Predictor | None = None,
                 return_chance: float = 0.2, min_confidence: float = 0.5) -> None:
        self.keep_gap_s = keep_gap_s  # gaps expected shorter than this stay on GPU ...
        self.kv_pressure = kv_pressure  # ... unless the replica's KV is fuller than this
        self.lead_std = lead_std  # prefetch this many standard deviations before the mean gap
        self.min_samples = min_samples  # a gap level's history before it answers
        self.predictor = predictor or Predictor(gaps=GapModel(default_s=default_gap_s, min_samples=min_samples))
        self.return_chance = return_chance
        self.min_confidence = min_confidence

    def observe_gap(self, agent: str, tool: str | None, gap_s: float) -> None:
        """A tool gap that just ended (history the next plans learn from)."""
        self.predictor.observe_gap(agent, tool, gap_s)

    def expected_gap(self, agent: str, tool: str | None) -> tuple[float, float]:
        """(mean, standard deviation) of the gap: the tool's, else the agent's, else a default."""
        p = self.predictor.tool_gap(agent, tool)
        return p.value, p.spread

    def let_go_in(self, agent: str, tenant: str, step: int, hint: int | None) -> float | None:
        """Seconds after call ``step`` ended at which its session's KV should go first when
        room is needed; None: keep it as the cache would (unsure, or it will likely return)."""
        p = self.predictor.unlikely_after(agent, tenant, step, self.return_chance, hint)
        if not p.usable(self.min_confidence) or p.value == float("inf"):
            return None
        return p.value

    def plan(self, hint: ToolHint, *, kv_usage: float, load_s: float) -> LifetimePlan:
        """The session's lifetime for this gap; ``load_s``: what bringing it back from host
        would take (the prefetch starts that much ahead)."""
        if hint.steps_left <= 0 or hint.tool is None:
            return LifetimePlan(Lifetime.DROP)
        mean, std = self.expected_gap(hint.agent, hint.tool)
        if mean <= self.keep_gap_s and kv_usage < self.kv_pressure:
            return LifetimePlan(Lifetime.KEEP, expected_gap_s=mean)
        lead = self.lead_std * std
        if hint.slack_s is not None and hint.slack_s < 2 * mean:
            lead *= 2  # little slack: a late prefetch costs the deadline, an early one only GPU room
        return LifetimePlan(Lifetime.HOST, prefetch_in_s=max(0.0, mean - lead - load_s), expected_gap_s=mean)
