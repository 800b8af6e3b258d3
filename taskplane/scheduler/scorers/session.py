"""Session affinity: the stateful plugin that keeps an agent's session on the replica
holding its KV cache, and the session pins every other plugin reads.

Like llm-d's session-affinity scorer with its response hook, it scores the pinned replica
and keeps the pins through the pipeline's lifecycle hooks: a placement (re)pins the session
(breaking the old pin when the call went elsewhere, with the reason), a completion starts
the tool-call gap (or releases the pin after the task's last step, or breaks it when the
replica failed the call), and a failed or departed replica loses its pins.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework.handle import Handle, Load
from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Scorer, Stateful, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.sessions import SessionPins
from taskplane.scheduler.types import CallOutcome, CallRequest, Decision, ReplicaView


@dataclass(slots=True)
class SessionAffinityParams:
    break_when_saturated: bool = param(
        True, "give the pinned replica no bonus when it is saturated, so the session moves to the best overlap"
    )


@register("session-affinity")
class SessionAffinityScorer(Scorer, Stateful):
    """1 for the replica the call's session is pinned to (its KV cache), 0 elsewhere.

    The pin outlives tool-call gaps by a TTL learned per agent (``SessionPins``); when the
    pinned replica is gone, unhealthy, filtered out or saturated the bonus disappears and
    the prefix scorer moves the session to the replica with the best remaining overlap.
    """

    Params = SessionAffinityParams

    def __init__(self, params: SessionAffinityParams, **kw: object) -> None:
        super().__init__(params, **kw)  # type: ignore[arg-type]
        self.pins = SessionPins(policy=self.policy)
        self.sessions = self.pins
        self._load = Load()

    def bind(self, handle: Handle) -> None:
        self.pins.metrics = handle.metrics
        self._load = handle.load

    def score(self, state: CycleState) -> np.ndarray:
        out = np.zeros(len(state.sel))
        pinned = state.pinned
        if pinned < 0:
            return out
        pos = state.candidate_position(pinned)
        if pos < 0:
            return out
        if self.params.break_when_saturated and bool(state.saturated[pinned]):
            return out
        out[pos] = 1.0
        return out

    # -- lifecycle hooks

    def placed(self, state: CycleState | OneCandidate, view: ReplicaView, decision: Decision) -> None:
        req = state.request
        session = req.session_id or req.task_id
        if session is None:
            return
        if isinstance(state, CycleState):  # a one-candidate decision kept its pin by construction
            reason = self._left_because(state, view)
            if reason is not None:
                self.pins.break_pin(session, reason)
                decision.session_moved = True
        tokens = int(req.prompt_tokens + state.completion_tokens)
        self.pins.placed(session, view.name, state.now_s, req.agent, tokens=tokens)

    def _left_because(self, state: CycleState, view: ReplicaView) -> str | None:
        """Why the session left its pinned replica for ``view``, or None if it did not."""
        pinned = state.pinned
        name = state.pinned_name
        if name is None or name == view.name:
            return None
        if pinned < 0:
            return "removed"
        if not bool(state.healthy[pinned]):
            return "failed"
        if self._load.holds_calls and bool(state.saturated[pinned]):
            return "saturated"
        if state.candidate_position(pinned) < 0:
            return "filtered"
        return "outscored"

    def completed(self, request: CallRequest, outcome: CallOutcome, now_s: float) -> None:
        session = request.session_id or request.task_id
        if session is None:
            return
        if not outcome.ok:
            self.pins.break_pin(session, "failed")
        elif request.steps_remaining == 0:
            self.pins.end(session)  # the task's last step: its context is done with
        else:
            self.pins.finished(session, now_s)

    def replica_failed(self, replica: str) -> int:
        return self.pins.drop_replica(replica, "failed")

    def replica_removed(self, replica: str) -> None:
        self.pins.drop_replica(replica, "removed")
