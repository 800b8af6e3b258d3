"""The disaggregation step: after the pipeline placed a call on a decode replica, its
decider says whether the prompt runs on a prefill-role replica, and the prefill profile
(its own filters, weighted scorers and picker, reading the same KV index) says which.

On a fleet without prefill-role replicas the step does nothing at all (no plugin runs, no
random draw), so aggregated runs are exactly as they were."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from taskplane.scheduler.disagg.base import Decider, PDCandidate
from taskplane.scheduler.framework.handle import Handle
from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Filter, Picker, Scorer
from taskplane.scheduler.framework.profile import run_filters, weighted_scores
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.types import CallRequest, Decision, ReplicaView


class DisaggStep:
    """A decider and the prefill profile it runs."""

    def __init__(self, decider: Decider, filters: Sequence[Filter], scorers: Sequence[Scorer], picker: Picker) -> None:
        self.decider = decider
        self.filters = list(filters)
        self.scorers = list(scorers)
        self.picker = picker
        self.disaggregated = 0  # calls sent to a prefill replica (for tools and tests)

    def bind(self, handle: Handle) -> None:
        for p in (self.decider, *self.filters, *self.scorers, self.picker):
            p.bind(handle)

    def prefill_state(self, handle: Handle, request: CallRequest, table: ReplicaTable, now_s: float,
                      model: str, decode: str | None = None) -> CycleState | None:
        """The prefill profile's candidates for ``request`` after its filters, never its decode
        replica (a "both" one is in the prefill pool too); None when none."""
        avoid = request.avoid_replicas if decode is None else (*request.avoid_replicas, decode)
        rows = table.without(table.prefill_pool(model), avoid)
        if not len(rows):
            return None
        state = CycleState(handle, request, table, rows, now_s, model)
        return None if run_filters(self.filters, state, metrics=handle.metrics) else state

    def pick(self, state: CycleState) -> int:
        """The prefill profile's choice: a position among ``state.sel``."""
        if len(state.sel) == 1:
            return 0
        totals, _ = weighted_scores(self.scorers, state)
        return self.picker.pick(state, totals)

    def after_placement(self, placed: CycleState | OneCandidate, decode: ReplicaView, decision: Decision,
                        decode_uncached: Callable[[], float]) -> None:
        """After the pipeline placed ``placed``'s call on ``decode``: disaggregate it when the
        fleet has prefill-role replicas for its model (``decode_uncached`` is asked only then)."""
        if len(placed.table.prefill_pool(placed.model)):
            self.apply(placed.handle, placed.request, placed.table, placed.now_s, placed.model, decode, decision,
                       decode_uncached())

    def apply(self, handle: Handle, request: CallRequest, table: ReplicaTable, now_s: float, model: str,
              decode: ReplicaView, decision: Decision, decode_uncached: float) -> None:
        """Set ``decision.prefill_replica`` when the call is disaggregated."""
        state = self.prefill_state(handle, request, table, now_s, model,
                                   decode.name if decode.role == "both" else None)
        if state is None:
            return
        c = PDCandidate(request=request, decode=decode, decode_uncached_tokens=decode_uncached,
                        decode_ttft_ms=decision.predicted_ttft_ms, prefill=state, latency=handle.latency)
        if not self.decider.consider(c):
            return
        pos = self.pick(state)
        if not self.decider.confirm(c, pos):
            return
        i = int(state.sel[pos])
        decision.prefill_replica = state.name(i)
        decision.reason = f"disaggregated: prefill on {decision.prefill_replica}, decode on {decode.name}"
        self.disaggregated += 1
