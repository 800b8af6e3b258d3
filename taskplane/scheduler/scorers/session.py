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
from taskplane.scheduler.predict import Predictor
from taskplane.scheduler.sessions import SessionPins
from taskplane.scheduler.types import CallOutcome, CallRequest, Decision, ReplicaView


@dataclass(slots=True)
class SessionAffinityParams:
    break_when_saturated: bool = param(
        True, "give the pinned replica no bonus when it is saturated, so the session moves to the best overlap"
    )
    predict_end: bool = param(
        False, "end a pin when the prediction layer says the session's last call ended (learned, with the SDK's "
        "hint as one input); off: only when the call's steps-remaining hint is 0"
    )
    end_p: float = param(0.5, "with predict_end: the predicted chance of a last call at which the pin ends")
    end_confidence: float = param(0.5, "with predict_end: the confidence the prediction needs; below it, "
                                  "the pin stays until its TTL, as with no hint")


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
        self._predictor = Predictor()
        self._steps: dict[object, int] = {}  # call -> its step, as the predictor counted it

    def bind(self, handle: Handle) -> None:
        self.pins.metrics = handle.metrics
        self._load = handle.load
        self._predictor = handle.predictor

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
        if self.params.predict_end:
            calls = 1.0 + self._expected_left(req, session, state.now_s)
        else:
            calls = 1.0 + (req.steps_remaining or 0)
        self.pins.placed(session, view.name, state.now_s, req.agent, tokens=tokens, calls=calls)

    def _expected_left(self, req: CallRequest, session: str, now_s: float) -> float:
        """Calls the session still makes after this one (0 when the prediction is unsure)."""
        agent, tenant = req.agent or "default", req.tenant or "default"
        step = self._predictor.observe_call(session, agent=agent, tenant=tenant, step=req.step, now_s=now_s,
                                            hint=req.steps_remaining)
        if len(self._steps) >= 100_000:
            self._steps.pop(next(iter(self._steps)))
        self._steps[req.call_id or id(req)] = step
        left = self._predictor.steps_left(agent, tenant, step, req.steps_remaining)
        return left.value if left.usable(self.params.end_confidence) else 0.0

    def _ends(self, request: CallRequest) -> bool:
        """Whether the session's last call just ended: the hint, or the prediction layer's."""
        if not self.params.predict_end:
            return request.steps_remaining == 0
        step = self._steps.pop(request.call_id or id(request), request.step)
        if step is None:
            return False
        p = self._predictor.session_end(request.agent or "default", request.tenant or "default", step,
                                        request.steps_remaining)
        return p.usable(self.params.end_confidence) and p.value >= self.params.end_p

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
        elif self._ends(request):
            self.pins.end(session)  # the task's last step: its context is done with
        else:
            self.pins.finished(session, now_s)

    def task_ended(self, session: str) -> None:
        self.pins.end(session)

    def replica_failed(self, replica: str) -> int:
        return self.pins.drop_replica(replica, "failed")

    def replica_removed(self, replica: str) -> None:
        self.pins.drop_replica(replica, "removed")
