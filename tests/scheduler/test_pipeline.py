"""The pipeline on its own (no flow control), and a stateful plugin's lifecycle hooks."""

from __future__ import annotations

import numpy as np
from _sched_util import fleet, replica, request, tokens

from taskplane.scheduler.core import Scheduler
from taskplane.scheduler.framework.handle import Handle
from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Kind, Scorer, Stateful
from taskplane.scheduler.framework.registry import REGISTRY
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.policies import build_policy
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.types import Action, CallOutcome, Decision, ReplicaView


class Recorder(Scorer, Stateful):
    """Scores 1 for replica ``b``; writes down every hook the pipeline calls."""

    def __init__(self) -> None:
        super().__init__(None, name="recorder", policy="t")
        self.seen: list[tuple[str, str]] = []
        self.handle: Handle | None = None

    def bind(self, handle: Handle) -> None:
        self.handle = handle

    def score(self, state: CycleState) -> np.ndarray:
        return np.array([1.0 if state.name(int(i)) == "b" else 0.0 for i in state.sel])

    def placed(self, state: CycleState | OneCandidate, view: ReplicaView, decision: Decision) -> None:
        self.seen.append(("placed", view.name))
        decision.reason = "seen by the recorder"

    def completed(self, request: object, outcome: CallOutcome, now_s: float) -> None:  # type: ignore[override]
        self.seen.append(("completed", outcome.replica))

    def replica_failed(self, replica: str) -> int:
        self.seen.append(("failed", replica))
        return 2

    def replica_removed(self, replica: str) -> None:
        self.seen.append(("removed", replica))


def test_the_pipeline_places_without_flow_control() -> None:
    rec = Recorder()
    pipe = Scheduler(name="t", filters=[REGISTRY.build(Kind.FILTER, "healthy")], scorers=[rec], metrics=False)
    assert rec.handle is pipe.handle and pipe.handle.sessions is None  # bound; no session plugin
    table = ReplicaTable([replica("a"), replica("b"), replica("c", healthy=False)])
    req = request(tokens(1, 2))
    state = pipe.state(req, table, pipe.pool(table, "m", ()), 0.0, "m")
    assert pipe.filter(state) is None and len(state.sel) == 2
    d = pipe.place(state)
    assert (d.action, d.replica, d.reason) == (Action.PLACE, "b", "seen by the recorder")
    assert d.scores == {"recorder": 1.0, "total": 1.0}
    pipe.observe_completion(req, CallOutcome("b"), 1.0)
    assert pipe.replica_failed("b") == 2
    pipe.replica_removed("a")
    assert rec.seen == [("placed", "b"), ("completed", "b"), ("failed", "b"), ("removed", "a")]
    assert pipe.pinned_candidate(req, table, 2.0) is None  # not sticky, no pins


def test_session_plugin_keeps_pins_through_the_hooks() -> None:
    sched = build_policy("taskplane", seed=1, metrics=False)
    pins = sched.sessions
    assert pins is not None and pins is sched.pipeline.handle.sessions
    pool = fleet(3)
    req = request(tokens(2, 4), session_id="s", step=0, steps_remaining=2)
    d = sched.decide(req, pool, 0.0)
    assert d.action is Action.PLACE and pins.get("s", 0.0) == d.replica  # placed: pinned
    sched.observe_completion(req, CallOutcome(d.replica or ""), 1.0)
    nxt = request(tokens(2, 5), session_id="s", step=1, steps_remaining=1)
    again = sched.decide(nxt, pool, 2.0)
    assert again.replica == d.replica and again.scores == {}  # sticky: the one-candidate path
    assert sched.replica_failed(d.replica or "") == 1 and pins.get("s", 3.0) is None  # failed: broken
