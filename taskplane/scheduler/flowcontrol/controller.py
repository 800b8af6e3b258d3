"""Flow control: decides whether a call is placed now, and composes the pipeline to place it.

State in (a ``CallRequest`` and the replicas as ``ReplicaView`` plain data), decision out,
with explicit times: the core never reads a clock to decide. Driving it (both the asyncio
gateway and the discrete-event simulator):

* ``decide(call, replicas, now_s)`` -> PLACE (send it), QUEUE (held), SHED (429 +
  Retry-After), UNMEETABLE (504) or NO_REPLICA (503);
* ``release(replicas, now_s)`` whenever capacity may have freed (a call finished, a
  replica joined) and after a QUEUE: returns ``(call, decision)`` for held calls that are
  now placed, shed or past their deadline;
* ``observe_completion``, ``on_kv_events``, ``replica_failed`` / ``replica_removed``: the
  pipeline's feedback, passed on.

What flow control does is its plugins' (flowcontrol/base.py: ordering, fairness,
shedding, working-set room, late binding, the prefill gate, each with its settings); this
class only runs them in order around the pipeline, with the fallback model a call may move
to and the deadline check. ``ReplicaView`` counts must include calls already placed (the
caller's in-flight bookkeeping); within one ``release`` pass flow control accounts for its
own placements. Without plugins (the baselines) every call the pipeline can place is placed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from taskplane.scheduler.core import Scheduler
from taskplane.scheduler.flowcontrol.admit import Admission
from taskplane.scheduler.flowcontrol.flowset import FlowSet, flow_from_settings
from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.scheduler.framework.handle import SessionsView
from taskplane.scheduler.framework.normalise import any_true
from taskplane.scheduler.framework.plugin import Filter
from taskplane.scheduler.kv.precise import BatchResult
from taskplane.scheduler.kvindex import KVIndex
from taskplane.scheduler.latency import LatencyModel
from taskplane.scheduler.metrics import DECISION_SECONDS, DECISIONS, MOVED
from taskplane.scheduler.response_cache import ResponseCache
from taskplane.scheduler.table import ReplicaTable, as_table
from taskplane.scheduler.types import Action, CallOutcome, CallRequest, Decision, ReplicaView


class FlowControl(Admission):
    """Fallback moves and deadlines around one placement pipeline, and its admission plugins."""

    def __init__(
        self,
        pipeline: Scheduler,
        *,
        flow: FlowSet | None = None,
        admission: AdmissionSettings | None = None,
        fallbacks: Mapping[str, str] | None = None,
        response_cache_entries: int = 0,
    ) -> None:
        if flow is None:
            flow = flow_from_settings(admission, policy=pipeline.name)
        super().__init__(pipeline, flow)
        self.fallbacks = dict(fallbacks or {})
        self.response_cache = ResponseCache(response_cache_entries) if response_cache_entries > 0 else None
        self._decisions = {a: DECISIONS.labels(self.name, a.value) for a in Action}
        self._seconds = DECISION_SECONDS.labels(self.name)
        # filters that may send a pinned session's call to the pool (most pipelines: none)
        self._pin_releasers = [f for f in pipeline.filters if type(f).releases_pin is not Filter.releases_pin]

    # what the pipeline holds, for callers that read it (tests, tools, the bench)
    @property
    def kv_index(self) -> KVIndex:
        return self.pipeline.kv_index

    @property
    def latency(self) -> LatencyModel:
        return self.pipeline.latency

    @property
    def sessions(self) -> SessionsView | None:
        return self.pipeline.handle.sessions

    # ------------------------------------------------------------------ decide

    def decide(
        self, request: CallRequest, replicas: ReplicaTable | Sequence[ReplicaView], now_s: float | None = None
    ) -> Decision:
        """Place, queue or refuse one call. ``now_s`` defaults to ``request.now_s``.

        ``replicas``: every replica the caller knows (any model), as a list of views or,
        for large fleets, a ``ReplicaTable`` the caller keeps up to date.
        """
        t0 = time.perf_counter() if self.metrics else 0.0
        now = request.now_s if now_s is None else now_s
        decision = self._decide(request, as_table(replicas), now)
        if self.metrics:
            self._decisions[decision.action].inc()
            self._seconds.observe(time.perf_counter() - t0)
        return decision

    def _decide(self, req: CallRequest, replicas: ReplicaTable, now: float) -> Decision:
        pipe = self.pipeline
        fb_model = self.fallbacks.get(req.model) if req.allow_fallback else None
        pool = pipe.pool(replicas, req.model, req.avoid_replicas)
        if not len(pool):
            if fb_model:
                moved = self._move(req, replicas, now, fb_model, f"no replica serves {req.model}")
                if moved is not None:
                    return moved
            return Decision(Action.NO_REPLICA, reason=f"no replica serves model {req.model!r}")
        kept = self._decide_pinned(req, replicas, now)
        if kept is not None:
            return kept
        state = pipe.state(req, replicas, pool, now, req.model)
        emptied = pipe.filter(state)
        if emptied is not None:
            if fb_model:
                moved = self._move(req, replicas, now, fb_model, f"filter {emptied} removed every replica")
                if moved is not None:
                    return moved
            return Decision(Action.NO_REPLICA, reason=f"filter {emptied!r} removed every replica of {req.model!r}")
        budget = req.budget_ms
        if budget is not None and self.flow is not None:  # baselines ignore deadlines
            best_now = state.fastest_total
            if best_now > budget:
                best_empty = float(state.c(state.prediction.empty_total_ms).min())
                if fb_model:
                    why = f"{req.model} predicted {best_now:.0f} ms > budget {budget:.0f} ms"
                    moved = self._move(req, replicas, now, fb_model, why)
                    if moved is not None:
                        return moved
                if best_empty > budget:
                    return Decision(
                        Action.UNMEETABLE,
                        model=req.model,
                        predicted_total_ms=best_empty,
                        reason=(
                            f"budget {budget:.0f} ms is below the fastest possible "
                            f"{best_empty:.0f} ms for {req.model!r} even on an idle replica"
                        ),
                    )
        if self.flow is not None:
            held = self.admit(state, now)
            if held is not None:
                return held
        return self.gated(req, pipe.place(state), replicas, now)

    def _decide_pinned(self, req: CallRequest, replicas: ReplicaTable, now: float) -> Decision | None:
        """A call whose session has a live pin is decided over its pinned replica alone --
        same filters, budget check, admission and scorers -- and stays there when that
        replica can take it; otherwise (no pin, filtered out, over budget, saturated, queue
        ahead) None sends it through the whole pool."""
        one = self.pipeline.pinned_candidate(req, replicas, now)
        if one is None or (self._pin_releasers and any(f.releases_pin(one) for f in self._pin_releasers)):
            return None
        if self.flow is not None:
            if req.budget_ms is not None and one.prediction.total_ms > req.budget_ms:
                return None
            if one.saturated or self.queue_ahead(req):
                return None
        return self.gated(req, self.pipeline.place_one(one), replicas, now)

    def _move(self, req: CallRequest, replicas: ReplicaTable, now: float, model: str, why: str) -> Decision | None:
        """Place on the fallback model when it can serve (within budget, if any)."""
        pipe = self.pipeline
        pool = pipe.pool(replicas, model, req.avoid_replicas)
        if not len(pool):
            return None
        state = pipe.state(req, replicas, pool, now, model)
        if pipe.filter(state) is not None:
            return None
        if req.budget_ms is not None and state.fastest_total > req.budget_ms:
            return None
        if self.flow is not None:
            free = ~state.c(state.saturated)
            if not any_true(free):
                return None
            state.narrow(free)
        decision = pipe.place(state)
        decision.reason = f"moved to fallback {model!r}: {why}"
        if self.metrics:
            MOVED.labels(self.name, model).inc()
        return decision

    # ------------------------------------------------------------------ feedback (the pipeline's)

    def observe_completion(self, request: CallRequest, outcome: CallOutcome, now_s: float) -> None:
        """A placed call ended: calibrate the latency model, start the session's tool gap."""
        self.pipeline.observe_completion(request, outcome, now_s)

    def on_kv_events(self, replica: str, events: Iterable[Any], seq: int | None = None) -> BatchResult | None:
        """Feed one batch of a replica's KV events (``seq``: the ZMQ sequence number)."""
        return self.pipeline.on_kv_events(replica, events, seq)

    def stored_blocks(self, replica: str, events: Iterable[Any]) -> list[int]:
        """The block hashes (ours) of the GPU blocks a fed batch of KV events stored."""
        return self.pipeline.stored_blocks(replica, events)

    def clear_replica(self, replica: str) -> None:
        """Missed KV events that cannot be replayed: forget what the replica holds."""
        self.pipeline.clear_replica(replica)

    def replica_failed(self, replica: str) -> int:
        """A replica failed: break its session pins (they move to the best overlap)."""
        return self.pipeline.replica_failed(replica)

    def replica_removed(self, replica: str) -> None:
        """A replica left the pool: drop its KV state and pins."""
        self.pipeline.replica_removed(replica)
