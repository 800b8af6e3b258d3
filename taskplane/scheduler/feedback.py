"""What the pipeline learns from its own placements, as lifecycle hooks beside the plugins'.

* :class:`RoutingMemory` records where prompts were sent in the KV index's approximate
  view, for the plugins that match against it (replicas without KV events, streams out of
  sync, or a plugin asking for the routing history itself);
* :class:`LatencyFeedback` remembers what a decision predicted from (GPU, queued work,
  batch size) and calibrates the latency model when the call completes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Stateful
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.kvindex import KVIndex
from taskplane.scheduler.latency import LatencyModel
from taskplane.scheduler.types import CallOutcome, CallRequest, Decision, ReplicaView

#: Placements remembered for calibration; the oldest is forgotten past this many.
MAX_REMEMBERED = 200_000


class RoutingMemory(Stateful):
    """Records a placed prompt's blocks as routed to its replica, when a plugin's KV
    source can read them: always for the approximate source, for untokenised prompts
    (text hashes: only the approximate view can match them), and for replicas whose KV
    events are out of sync when any plugin reads the index."""

    def __init__(self, kv_index: KVIndex, sources: Iterable[str | None]) -> None:
        self.kv_index = kv_index
        sources = set(sources)
        self.always = "approximate" in sources
        self.unsynced = bool(sources - {None})

    def placed(self, state: CycleState | OneCandidate, view: ReplicaView, decision: Decision) -> None:
        req = state.request
        if req.block_hashes and (
            self.always or not req.tokenized or (self.unsynced and not self.kv_index.precise.in_sync(view.name))
        ):
            self.kv_index.record_routing(view.name, req.block_hashes, view.kv_blocks_total)


class LatencyFeedback(Stateful):
    """Calibrates the latency model from completed calls, against what their decision knew."""

    def __init__(self, latency: LatencyModel) -> None:
        self.latency = latency
        self._placed: dict[Any, tuple[str, float, float, str | None]] = {}

    def placed(self, state: CycleState | OneCandidate, view: ReplicaView, decision: Decision) -> None:
        req = state.request
        key = req.call_id or id(req)
        if len(self._placed) >= MAX_REMEMBERED:
            self._placed.pop(next(iter(self._placed)))
        self._placed[key] = (view.gpu, self.latency.queued_tokens(view), float(view.num_running + 1), view.name)

    def completed(self, request: CallRequest, outcome: CallOutcome, now_s: float) -> None:
        known = self._placed.pop(request.call_id or id(request), None)
        gpu = outcome.gpu or (known[0] if known else None)
        if gpu is None or not outcome.ok:
            return
        queued = known[1] if known else 0.0
        batch = float(outcome.batch_size) if outcome.batch_size else (known[2] if known else 1.0)
        ttft = outcome.ttft_s
        if ttft is not None and outcome.cold_start_s:
            ttft = max(ttft - outcome.cold_start_s, 0.0)
        decode_s = (
            outcome.total_s - outcome.ttft_s if outcome.total_s is not None and outcome.ttft_s is not None else None
        )
        self.latency.observe(
            gpu,
            model=request.model,
            prefill_tokens=queued + max(outcome.prompt_tokens - outcome.cached_tokens, 0),
            ttft_s=ttft,
            completion_tokens=outcome.completion_tokens,
            decode_s=decode_s,
            batch_size=batch,
            cold_start_s=outcome.cold_start_s,
            prompt_tokens=outcome.prompt_tokens or None,
        )
