"""The simulator carrying out the control plane's KV lifetimes across tool gaps
(:mod:`taskplane.scheduler.kv.lifetimes`): when a call ends and its task goes into a tool,
the planner is told (the SDK's "in a tool" hint) and its plan is applied to the replica the
session lives on: nothing (keep), a prefetch from the host tier shortly before the next
call is expected, or the finished task's private blocks evicted at once (drop).

Simulated only: vLLM has no API to prefetch a session from its CPU offload store or to
evict chosen blocks; against real vLLM only the placement part (sending the call where its
KV is, GPU or host) applies.

What the plans know of the future comes from the planner's prediction layer
(:mod:`taskplane.scheduler.predict`), fed here with what a live control plane sees: calls
as they arrive (with the SDK's steps hint under the cluster's hints mode), tool gaps as
they end, and an SDK task's end when it reports it (its last call succeeded).

A replayed trace (open-loop calls) has no tool gaps and no end: a chat conversation never
says it is over. When a session's call ends, the planner predicts how long until the chance
that it comes back is low (:meth:`LifetimePlanner.let_go_in`: the learned share of
conversations that stopped at this turn, and how long the others' gaps last). From then its
private blocks -- past the leading blocks it shares with another session
(:func:`shared_leading_blocks`, what a control plane knows as the shared system prompt) --
are *demoted*: the first evicted when room is needed (LRU would keep them longest, they were
just used, and evict the contexts of sessions that will come back), ordinary cache again if
the conversation comes back. With ``exact`` hints (the oracle) the true last turn drops them
at once instead: a bound.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from taskplane.scheduler.kv.lifetimes import Lifetime, LifetimePlanner, ToolHint
from taskplane.sim.calls import SimCall, TaskState
from taskplane.sim.events import Event, EventQueue
from taskplane.sim.hints import HintMode, steps_hint
from taskplane.sim.replicas import SimReplicas
from taskplane.sim.tokens import RepeatedBlocks
from taskplane.sim.workloads.base import TaskSpec
from taskplane.store.records import TaskStatus


def shared_leading_blocks(tasks: Iterable[TaskSpec]) -> dict[str, int]:
    """Per open-loop task: how many leading blocks of its prompts another task's prompts
    also begin with (a prefix is identified by all its block contents, as the chained
    hashes do)."""
    prefixes: dict[str, set[tuple[int, ...]]] = {}
    for spec in tasks:
        if spec.open_loop:
            own = prefixes.setdefault(spec.task_id, set())
            for c in spec.calls:
                contents = tuple(c.contents or ())
                own.update(contents[: j + 1] for j in range(len(contents)))
    users = Counter(p for own in prefixes.values() for p in own)
    return {tid: max((len(p) for p in own if users[p] > 1), default=0) for tid, own in prefixes.items()}


@dataclass(slots=True)
class Prefetch:
    """A scheduled prefetch of a session's blocks back to one replica's GPU."""

    replica: int
    task: TaskState
    step: int  # the call it is for
    hashes: list[int]
    tokens: RepeatedBlocks | None


@dataclass(slots=True)
class Demotion:
    """A session's blocks to let go first, once it has stayed away long enough."""

    replica: int
    task: TaskState
    step: int  # the call that, had it come, would have shown the session goes on
    hashes: list[int]


@dataclass(slots=True)
class LifetimeCounts:
    keep: int = 0
    host: int = 0
    drop: int = 0
    demote: int = 0  # sessions predicted over: first to go when room is needed
    demote_back: int = 0  # ... that came back (the demotion taken back)
    prefetches: int = 0  # carried out (blocks were loaded)
    prefetch_late: int = 0  # the call came first
    dropped_blocks: int = 0


class Lifetimes:
    """Applies a :class:`LifetimePlanner`'s plans in the cluster simulator."""

    def __init__(self, planner: LifetimePlanner, fleet: SimReplicas, events: EventQueue, block_size: int,
                 with_tokens: bool, tasks: Iterable[TaskSpec] = (), hints: HintMode = HintMode.EXACT) -> None:
        self.planner = planner
        self.fleet = fleet
        self.events = events
        self.bs = block_size
        self.with_tokens = with_tokens
        self.counts = LifetimeCounts()
        self.hints = hints
        self.predictor = planner.predictor
        self._arrived: dict[str, int] = {}  # task id -> the last step that arrived
        self._shared = shared_leading_blocks(tasks)  # open-loop task id -> its shared leading blocks
        self._demoted: dict[str, list[int]] = {}  # task id -> the blocks it has demoted
        self._ended_s: dict[str, float] = {}  # open-loop task id -> when its last call ended

    def arrived(self, task: TaskState, k: int, t: float) -> None:
        """Call ``k`` of a task arrives at ``t``: the tool gap before it is history now."""
        spec = task.spec
        self._arrived[spec.task_id] = k
        demoted = self._demoted.pop(spec.task_id, None)
        if demoted is not None:  # it was not over: its blocks are ordinary cache again
            self.counts.demote_back += 1
            demoted.clear()
        self.predictor.observe_call(spec.session_id or spec.task_id, agent=spec.agent, tenant=spec.tenant, step=k,
                                    now_s=t, hint=steps_hint(spec, k, self.hints))
        if k > 0 and not spec.open_loop:
            c = spec.calls[k]
            self.planner.observe_gap(spec.agent, c.tool, c.gap_s)
        elif spec.open_loop:
            ended = self._ended_s.pop(spec.task_id, None)
            if ended is not None and t >= ended:  # the user's gap between two turns
                self.planner.observe_gap(spec.agent, None, t - ended)

    def call_ended(self, call: SimCall, i: int, t: float) -> None:
        """A call succeeded on replica ``i`` at ``t``: plan its session's KV for the gap."""
        task, spec = call.task, call.task.spec
        eng = self.fleet.engines[i]
        if eng.tiers is None:
            return
        k = call.step + 1
        session = spec.session_id or spec.task_id
        if spec.open_loop:  # no tool gap to plan: only whether the conversation is over
            shared = self._shared.get(spec.task_id, 0)
            if self.hints.oracle:  # the bound: the true last turn
                if k >= len(spec.calls):
                    self._drop(call, i, t, shared)
                return
            self._ended_s[spec.task_id] = t
            hint = call.request.steps_remaining if call.request is not None else None
            after = self.planner.let_go_in(spec.agent, spec.tenant, call.step, hint)
            if after is not None:  # likely over, not surely: its blocks go first when room is needed
                self.events.push(t + after, Event.DEMOTE, Demotion(i, task, k, list(call.hashes[shared: call.n_total_blocks])))
            return
        if self.hints.oracle:
            steps_left = len(spec.calls) - k
        elif task.status is TaskStatus.SUCCEEDED:  # the task reported its end
            steps_left = 0
        else:  # it goes into a tool (the SDK's hint); how many calls follow only the prediction says
            hint = call.request.steps_remaining if call.request is not None else None
            steps_left = max(1, round(self.predictor.steps_left(spec.agent, spec.tenant, call.step, hint).value))
        if task.status is not None:
            self.predictor.task_ended(session, calls=k)
        tool = spec.calls[k].tool if k < len(spec.calls) else None
        slack = None if task.deadline_abs is None else task.deadline_abs - t
        hashes = list(call.hashes[: call.n_total_blocks])
        load_s = len(hashes) * eng.tiers.block_bytes / eng.tiers.pcie_bw
        plan = self.planner.plan(ToolHint(agent=spec.agent, tool=tool, steps_left=steps_left, slack_s=slack),
                                 kv_usage=eng.kv_usage(), load_s=load_s)
        c = self.counts
        if plan.action is Lifetime.DROP:
            self._drop(call, i, t, spec.prefix_tokens // self.bs)  # the agent's system prompt: others use it
        elif plan.action is Lifetime.KEEP:
            c.keep += 1
        else:
            c.host += 1
            if plan.prefetch_in_s is not None:
                tokens = (RepeatedBlocks(call.contents, self.bs, call.prompt_tokens + call.output_tokens)
                          if self.with_tokens else None)
                self.events.push(t + plan.prefetch_in_s, Event.PREFETCH, Prefetch(i, task, k, hashes, tokens))

    def _drop(self, call: SimCall, i: int, t: float, shared: int) -> None:
        """The session is done: its blocks past the ``shared`` leading ones leave replica ``i``'s GPU."""
        self.counts.drop += 1
        self.counts.dropped_blocks += self.fleet.engines[i].drop(list(call.hashes[shared: call.n_total_blocks]), t)
        self.fleet.mark(i)

    def demote(self, d: Demotion) -> None:
        """Let a session's blocks go first when room is needed, unless it came back meanwhile."""
        if self._arrived.get(d.task.spec.task_id, -1) >= d.step:
            return
        self.counts.demote += 1
        self._demoted[d.task.spec.task_id] = self.fleet.engines[d.replica].demote(d.hashes)

    def prefetch(self, p: Prefetch, t: float) -> bool:
        """Carry out a prefetch unless its call already came (or the task ended)."""
        task = p.task
        if task.status is not None or self._arrived.get(task.spec.task_id, -1) >= p.step:
            self.counts.prefetch_late += 1
            return False
        if self.fleet.engines[p.replica].prefetch(p.hashes, p.tokens, t):
            self.counts.prefetches += 1
            self.fleet.mark(p.replica)
            return True
        return False
