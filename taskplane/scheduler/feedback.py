"""What the pipeline learns from its own placements, as lifecycle hooks beside the plugins'.

* :class:`RoutingMemory` records where prompts were sent in the KV index's approximate
  view, for the plugins that match against it (replicas without KV events, streams out of
  sync, or a plugin asking for the routing history itself);
* :class:`LatencyFeedback` remembers what a decision predicted from (GPU, queued work,
  batch size) and calibrates the latency model when the call completes;
* :class:`ToolGapHints` hands the SDK's "in a tool" hint (``CallRequest.tool``, the
  ``X-Taskplane-Tool`` header) to the KV-lifetime planner: the gap each tool took, learned
  per agent and tool, and a lifetime planned for each session going into a gap.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Stateful
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.kv.lifetimes import LifetimePlanner, ToolHint
from taskplane.scheduler.kvindex import KVIndex
from taskplane.scheduler.latency import LatencyModel
from taskplane.scheduler.metrics import LIFETIME_PLANS, TOOL_HINTS
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


#: the planner's key for a gap whose tool is not known yet: on the gateway path the hint
#: comes with the call after the gap, so a plan made when a call ends uses the agent's gaps
UNKNOWN_TOOL = "*"


class ToolGapHints(Stateful):
    """The gateway's side of KV lifetimes: feeds the planner the tool gaps the SDK's hint
    names, and plans each session's lifetime when its call ends.

    vLLM offers no API to prefetch a session from its CPU offload store or to evict chosen
    blocks, so against real replicas the plans are counted
    (``taskplane_scheduler_kv_lifetime_plans_total``), not carried out; the simulator
    carries them out (``taskplane.sim.lifetimes``)."""

    def __init__(self, planner: LifetimePlanner, *, policy: str = "taskplane", metrics: bool = True) -> None:
        self.planner = planner
        self.policy = policy
        self.metrics = metrics
        self.plans: dict[str, int] = {}  # action -> count (also without Prometheus)
        self.hints = 0
        self._ended: dict[str, tuple[float, str | None]] = {}  # session -> (its last call's end, agent)
        self._usage: dict[Any, float] = {}  # call -> KV usage of its replica when placed
        self._plan_counters: dict[str, Any] = {}  # action -> its LIFETIME_PLANS child

    def placed(self, state: CycleState | OneCandidate, view: ReplicaView, decision: Decision) -> None:
        req = state.request
        session = req.session_id or req.task_id
        if session is None:
            return
        ended = self._ended.pop(session, None)
        if req.tool and ended is not None:
            self.hints += 1
            if self.metrics:
                TOOL_HINTS.labels(self.policy).inc()
            self.planner.observe_gap(req.agent or ended[1] or "default", req.tool, max(req.now_s - ended[0], 0.0))
        if len(self._usage) >= MAX_REMEMBERED:
            self._usage.pop(next(iter(self._usage)))
        total = max(view.kv_blocks_total, 1)
        self._usage[req.call_id or id(req)] = 1.0 - view.kv_blocks_free / total

    def completed(self, request: CallRequest, outcome: CallOutcome, now_s: float) -> None:
        usage = self._usage.pop(request.call_id or id(request), 0.0)
        session = request.session_id or request.task_id
        if session is None or not outcome.ok:
            return
        steps_left = request.steps_remaining
        if steps_left is None or steps_left > 0:
            if len(self._ended) >= MAX_REMEMBERED:
                self._ended.pop(next(iter(self._ended)))
            self._ended[session] = (now_s, request.agent)
        budget = request.budget_ms
        hint = ToolHint(agent=request.agent or "default", tool=UNKNOWN_TOOL if steps_left != 0 else None,
                        steps_left=1 if steps_left is None else steps_left,
                        slack_s=None if budget is None else budget / 1000.0 - (now_s - request.now_s))
        action = self.planner.plan(hint, kv_usage=usage, load_s=0.0).action.value
        self.plans[action] = self.plans.get(action, 0) + 1
        if self.metrics:
            child = self._plan_counters.get(action)
            if child is None:
                child = self._plan_counters[action] = LIFETIME_PLANS.labels(self.policy, action)
            child.inc()
