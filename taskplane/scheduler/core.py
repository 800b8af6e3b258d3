"""The Scheduler: the placement pipeline -- filters, then weighted scorers, then a picker,
over one per-decision state -- and nothing else.

It knows no admission, queue or fallback: flow control (:mod:`taskplane.scheduler.flowcontrol`)
composes it and decides whether a call is placed now. Plugins see a narrow :class:`Handle` (KV index, tenants, latency model, session view),
never this object; the stateful ones (:class:`Stateful`) and the pipeline's own feedback
(routing memory, latency calibration) hear of each call's life through lifecycle hooks.

The algorithmic fast path: with ``sticky``, a call whose session holds a live pin is
decided over that one replica (:class:`OneCandidate`), so a continuing call costs the same
at 10 or 10,000 replicas.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from taskplane.scheduler.disagg.step import DisaggStep
from taskplane.scheduler.feedback import LatencyFeedback, RoutingMemory, ToolGapHints
from taskplane.scheduler.framework.handle import Handle, Load
from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Filter, Picker, Scorer, Stateful
from taskplane.scheduler.framework.profile import run_filters, weighted_scores
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.kv.lifetimes import LifetimePlanner
from taskplane.scheduler.kv.precise import BatchResult
from taskplane.scheduler.kvindex import KVIndex
from taskplane.scheduler.latency import LatencyModel
from taskplane.scheduler.metrics import PLACEMENTS
from taskplane.scheduler.pickers.basic import MaxScoreParams, MaxScorePicker
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.tenants import TenantPolicy, tenant_table
from taskplane.scheduler.types import Action, CallOutcome, CallRequest, Decision, ReplicaView


class Scheduler:
    """Filters -> weighted scorers -> picker, with the lifecycle hooks of its plugins."""

    def __init__(
        self,
        *,
        name: str = "custom",
        filters: Sequence[Filter] = (),
        scorers: Sequence[Scorer] = (),
        picker: Picker | None = None,
        seed: int = 0,
        tenants: Iterable[Any] | Mapping[str, TenantPolicy] | None = None,
        kv_index: KVIndex | None = None,
        latency: LatencyModel | None = None,
        load: Load | None = None,
        sticky: bool = False,
        metrics: bool = True,
        lifetimes: LifetimePlanner | None = None,
        disagg: DisaggStep | None = None,
    ) -> None:
        self.name = name
        self.filters = list(filters)
        self.scorers = list(scorers)
        self.picker: Picker = picker or MaxScorePicker(MaxScoreParams(), policy=name)
        self.seed = seed
        self.sticky = sticky  # decide a pinned session's call over its replica first
        self.metrics = metrics
        self._placements: dict[str, Any] = {}  # replica -> its PLACEMENTS child (``labels`` cost ~5 us a call)
        plugins = [*self.filters, *self.scorers, self.picker]
        stateful = [p for p in plugins if isinstance(p, Stateful)]
        self.handle = Handle(
            kv_index=kv_index or KVIndex(metrics=metrics),
            latency=latency or LatencyModel(),
            tenants=dict(tenants) if isinstance(tenants, Mapping) else tenant_table(tenants),
            rng=np.random.default_rng(seed),
            sessions=next((p.sessions for p in stateful if p.sessions is not None), None),
            load=load or Load(),
            metrics=metrics,
            policy=name,
        )
        for p in plugins:
            p.bind(self.handle)
        self.disagg = disagg  # prefill/decode disaggregation after the decode placement
        if disagg is not None:
            disagg.bind(self.handle)
        self.hooks: list[Stateful] = [*stateful, RoutingMemory(self.handle.kv_index, (p.kv_source for p in plugins)),
                                      LatencyFeedback(self.handle.latency)]
        # KV lifetimes across tool gaps, from the SDK's hint (presets with kv_lifetimes)
        self.tool_hints = ToolGapHints(lifetimes, policy=name, metrics=metrics) if lifetimes is not None else None
        if self.tool_hints is not None:
            self.hooks.append(self.tool_hints)

    @property
    def kv_index(self) -> KVIndex:
        return self.handle.kv_index

    @property
    def latency(self) -> LatencyModel:
        return self.handle.latency

    # ------------------------------------------------------------------ one decision

    @staticmethod
    def pool(table: ReplicaTable, model: str, avoid: tuple[str, ...]) -> np.ndarray:
        """The table rows serving ``model``, without the replicas to avoid."""
        return table.without(table.pool(model), avoid)

    def state(self, request: CallRequest, table: ReplicaTable, rows: np.ndarray, now_s: float, model: str) -> CycleState:
        """A decision's state over the pool ``rows`` (serving ``model``)."""
        return CycleState(self.handle, request, table, rows, now_s, model)

    def filter(self, state: CycleState) -> str | None:
        """Run the filters; the name of the one that left no candidate, else None."""
        return run_filters(self.filters, state, metrics=self.metrics)

    def place(self, state: CycleState) -> Decision:
        """Score the candidates and pick one. A single candidate (a pool of one) is a
        forced choice: it is not scored."""
        n = len(state.sel)
        totals, scored = weighted_scores(self.scorers, state) if n > 1 else (np.zeros(n), [])
        pos = self.picker.pick(state, totals) if n > 1 else 0
        i = int(state.sel[pos])
        view = state.view(i)
        scores = {scorer.name: float(s[pos]) for scorer, s in scored}
        if scored:
            scores["total"] = float(totals[pos])
        if self.metrics:
            for scorer, s in scored:
                scorer.hist.observe(float(s[pos]))
        decision = self._placed(state, view, scores)
        matched = state._matched.get("auto")
        pred = state._prediction
        decision.cached_blocks = int(matched[i]) if matched is not None else 0
        if pred is not None:
            decision.predicted_ttft_ms, decision.predicted_total_ms, decision.predicted_queue_ms = (
                float(pred.ttft_ms[i]), float(pred.total_ms[i]), float(pred.queue_ms[i]))
        if self.disagg is not None:
            self.disagg.after_placement(state, view, decision, lambda: float(state.uncached_tokens()[i]))
        return decision

    def pinned_candidate(self, request: CallRequest, table: ReplicaTable, now_s: float) -> OneCandidate | None:
        """Sticky sessions: the call's pinned replica as a one-candidate decision, when the
        session has a live pin there, the replica serves the call's model and every filter
        keeps it; else None (the call is decided over the whole pool)."""
        pins = self.handle.sessions
        if not self.sticky or pins is None:
            return None
        name = pins.get(request.session_id or request.task_id, now_s)
        if name is None:
            return None
        row = table.row_of(name)
        if row is None or table.views[row].model != request.model or name in request.avoid_replicas:
            return None
        one = OneCandidate(self.handle, request, table, row, now_s)
        for f in self.filters:
            if not f.keeps(one):
                if self.metrics:
                    f.filtered.inc(1)
                return None
        return one

    def place_one(self, one: OneCandidate) -> Decision:
        """``place`` for a session kept on its pinned replica: a forced choice, not scored."""
        decision = self._placed(one, one.view, {})
        pred = one._prediction
        decision.cached_blocks = int(one._matched) if one._matched is not None else 0
        if pred is not None:
            decision.predicted_ttft_ms, decision.predicted_total_ms, decision.predicted_queue_ms = (
                pred.ttft_ms, pred.total_ms, pred.queue_ms)
        if self.disagg is not None:
            self.disagg.after_placement(one, one.view, decision, one.uncached_tokens)
        return decision

    def _placed(self, state: CycleState | OneCandidate, view: ReplicaView, scores: dict[str, float]) -> Decision:
        """The PLACE decision for ``view``, after every lifecycle hook heard of it."""
        if self.metrics:
            child = self._placements.get(view.name)
            if child is None:
                child = self._placements[view.name] = PLACEMENTS.labels(self.name, view.name)
            child.inc()
        decision = Decision(Action.PLACE, replica=view.name, model=state.model, gpu=view.gpu, scores=scores)
        for hook in self.hooks:
            hook.placed(state, view, decision)
        return decision

    # ------------------------------------------------------------------ feedback

    def observe_completion(self, request: CallRequest, outcome: CallOutcome, now_s: float) -> None:
        """A placed call ended: calibrate the latency model, start the session's tool gap."""
        for hook in self.hooks:
            hook.completed(request, outcome, now_s)

    def task_ended(self, session: str, calls: int | None = None) -> None:
        """A task reported its end (the SDK's workflow finished): its length is history now,
        and the context its session pins is done with."""
        self.handle.predictor.task_ended(session, calls=calls)
        for hook in self.hooks:
            hook.task_ended(session)

    def on_kv_events(self, replica: str, events: Iterable[Any], seq: int | None = None) -> BatchResult | None:
        """Feed one batch of a replica's KV events (``seq``: the ZMQ sequence number)."""
        if seq is None:
            self.handle.kv_index.apply_events(replica, events)
            return None
        return self.handle.kv_index.apply_batch(replica, seq, events)

    def stored_blocks(self, replica: str, events: Iterable[Any]) -> list[int]:
        """The block hashes (ours) of the GPU blocks a batch of KV events, already fed,
        stored on ``replica``: the gateway marks begun the prefill of calls whose last block is there."""
        return self.handle.kv_index.stored_blocks(replica, events)

    def clear_replica(self, replica: str) -> None:
        """Missed KV events that cannot be replayed: forget what the replica holds."""
        self.handle.kv_index.clear_replica(replica)

    def replica_failed(self, replica: str) -> int:
        """A replica failed: break its session pins (they move to the best overlap)."""
        return sum(hook.replica_failed(replica) for hook in self.hooks)

    def replica_removed(self, replica: str) -> None:
        """A replica left the pool: drop its KV state and pins."""
        self.handle.kv_index.remove_replica(replica)
        for hook in self.hooks:
            hook.replica_removed(replica)
