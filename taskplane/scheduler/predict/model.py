"""One predictor for every decision: sessions followed as their calls arrive, task ends
(reported, or inferred when a conversation stays idle), and the per-quantity models.

A task that reports its end (an SDK task finishing) teaches its total at once. A chat
conversation never says it is over: when it has been idle for ``idle_end_s`` its calls so
far count as its total; should it come back, that total is taken back and it goes on.

Until then, the sessions still open say something too: each has made at least the calls
seen so far, so the calls seen per session started is a lower bound on the mean total
(``later_calls_at_least``), known from the first minutes of a stream.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from taskplane.scheduler.predict.base import Prediction, evidence
from taskplane.scheduler.predict.gaps import GapModel
from taskplane.scheduler.predict.outputs import OutputModel
from taskplane.scheduler.predict.steps import StepsModel

#: sessions remembered (open, and closed ones that might come back)
MAX_SESSIONS = 200_000


@dataclass(slots=True)
class TaskHistory:
    """One finished task from history (the store's tasks and calls, at start-up)."""

    agent: str
    tenant: str
    calls: int
    hinted_total: int | None = None  # the author's step estimate, if it sent one
    output_tokens: tuple[int, ...] = ()
    gaps_s: tuple[tuple[str | None, float], ...] = ()  # (tool, gap) between its calls


@dataclass(slots=True)
class _Seen:
    """Sessions started and calls seen, open sessions included."""

    sessions: int = 0
    calls: int = 0


@dataclass(slots=True)
class _Session:
    agent: str
    tenant: str
    calls: int
    last_s: float
    hinted_total: int | None


class Predictor:
    """Learns online from the calls and task ends it is told of; answers with confidences."""

    def __init__(self, *, idle_end_s: float = 900.0, steps: StepsModel | None = None, gaps: GapModel | None = None,
                 outputs: OutputModel | None = None) -> None:
        self.idle_end_s = idle_end_s
        self.steps = steps or StepsModel()
        self.gaps = gaps or GapModel()
        self.outputs = outputs or OutputModel()
        self._open: OrderedDict[str, _Session] = OrderedDict()  # by last activity, oldest first
        self._idle_closed: OrderedDict[str, _Session] = OrderedDict()  # ended by idleness: may come back
        self._seen: dict[tuple[str, str], _Seen] = {}  # per (tenant, agent) and ("*", agent)

    # -- what happened

    def observe_call(self, session: str, *, agent: str, tenant: str, step: int | None, now_s: float,
                     hint: int | None = None) -> int:
        """Call ``step`` (0-based; None: the next after those seen) of ``session`` arrived at
        ``now_s``; ``hint``: the SDK's steps remaining on it, if any. Returns the step."""
        self.expire(now_s)
        s = self._open.pop(session, None)
        if s is None:
            s = self._idle_closed.pop(session, None)
            if s is not None:  # it came back: its total was not its total
                self.steps.observe_total(s.agent, s.tenant, s.calls, weight=-1)
            else:
                s = _Session(agent, tenant, 0, now_s, None)
                self._count(agent, tenant, sessions=1)
        if step is None:
            step = s.calls
        if step + 1 > s.calls:
            self._count(agent, tenant, calls=step + 1 - s.calls)
        s.calls = max(s.calls, step + 1)
        s.last_s = now_s
        if s.hinted_total is None and hint is not None:
            s.hinted_total = step + 1 + max(hint, 0)
        self._open[session] = s
        if len(self._open) > MAX_SESSIONS:
            self._open.popitem(last=False)
        return step

    def _count(self, agent: str, tenant: str, *, sessions: int = 0, calls: int = 0) -> None:
        for key in ((tenant, agent), ("*", agent)):
            seen = self._seen.setdefault(key, _Seen())
            seen.sessions += sessions
            seen.calls += calls

    def observe_gap(self, agent: str, tool: str | None, gap_s: float) -> None:
        self.gaps.observe(agent, tool, gap_s)

    def task_ended(self, session: str, *, calls: int | None = None) -> None:
        """The task reported its end (``calls``: its total, else the calls seen)."""
        s = self._open.pop(session, None)
        if s is None:
            return
        self._close(s, calls or s.calls)

    def expire(self, now_s: float) -> None:
        """Conversations idle for ``idle_end_s`` are taken as over."""
        cutoff = now_s - self.idle_end_s
        while self._open:
            session, s = next(iter(self._open.items()))
            if s.last_s > cutoff:
                break
            del self._open[session]
            self._close(s, s.calls)
            self._idle_closed[session] = s
            if len(self._idle_closed) > MAX_SESSIONS:
                self._idle_closed.popitem(last=False)

    def _close(self, s: _Session, total: int) -> None:
        self.steps.observe_total(s.agent, s.tenant, total)
        if s.hinted_total is not None:
            self.steps.observe_hint(s.agent, s.hinted_total, total)

    def seed(self, history: Iterable[TaskHistory]) -> int:
        """Learn from finished tasks of the past; returns how many were read."""
        n = 0
        for h in history:
            self.steps.observe_total(h.agent, h.tenant, h.calls)
            if h.hinted_total is not None:
                self.steps.observe_hint(h.agent, h.hinted_total, h.calls)
            for tokens in h.output_tokens:
                self.outputs.observe(h.agent, None, tokens)
            for tool, gap in h.gaps_s:
                self.gaps.observe(h.agent, tool, gap)
            n += 1
        return n

    # -- what will happen

    def steps_left(self, agent: str, tenant: str, step: int, hint: int | None = None) -> Prediction:
        return self.steps.steps_left(agent, tenant, step, hint)

    def later_calls_at_least(self, agent: str, tenant: str, *, half: float = 10.0) -> Prediction:
        """A lower bound on the calls a new session of ``agent`` makes after its first: the
        calls seen per session started, minus one (open sessions have made at least those);
        confidence from the sessions seen (0.5 at ``half``), per tenant where it has any."""
        seen = self._seen.get((tenant, agent)) or self._seen.get(("*", agent))
        if seen is None or seen.sessions == 0:
            return Prediction(0.0, 0.0)
        return Prediction(seen.calls / seen.sessions - 1.0, evidence(seen.sessions, half), seen.sessions, "learned")

    def session_end(self, agent: str, tenant: str, step: int, hint: int | None = None) -> Prediction:
        return self.steps.session_end(agent, tenant, step, hint)

    def tool_gap(self, agent: str, tool: str | None) -> Prediction:
        return self.gaps.predict(agent, tool)

    def output_tokens(self, agent: str, tool: str | None = None, cap: int | None = None) -> Prediction:
        return self.outputs.predict(agent, tool, cap)

    def returns(self, agent: str, tenant: str, step: int, idle_s: float, hint: int | None = None) -> Prediction:
        """The chance that a session whose call ``step`` ended ``idle_s`` ago makes another:
        it had not ended there (1 - the hazard) and its gap lasts longer than that."""
        end = self.session_end(agent, tenant, step, hint)
        longer = self.gaps.longer_than(agent, None, idle_s)
        go_on = (1.0 - end.value) * longer.value
        value = go_on / (end.value + go_on) if end.value + go_on > 0 else 0.0
        return Prediction(value, min(end.confidence, longer.confidence), min(end.samples, longer.samples), "learned")

    def unlikely_after(self, agent: str, tenant: str, step: int, chance: float, hint: int | None = None) -> Prediction:
        """How long after call ``step`` ended its session's chance of another call falls below
        ``chance`` (``inf``: never, by this history; 0: already)."""
        end = self.session_end(agent, tenant, step, hint)
        if end.value >= 1.0:
            return Prediction(0.0, end.confidence, end.samples, end.source)
        if end.value <= 0.0:
            return Prediction(float("inf"), end.confidence, end.samples, end.source)
        # (1 - h) S / (h + (1 - h) S) < c  <=>  S < c h / ((1 - c)(1 - h))
        longer = chance * end.value / ((1.0 - chance) * (1.0 - end.value))
        if longer >= 1.0:
            return Prediction(0.0, end.confidence, end.samples, end.source)
        gap = self.gaps.quantile(agent, None, 1.0 - longer)
        return Prediction(gap.value, min(end.confidence, gap.confidence), min(end.samples, gap.samples), "learned")

    def remaining_work(self, agent: str, tenant: str, step: int, hint: int | None = None, *,
                       tokens_per_call: float) -> Prediction:
        """Tokens a task still has to process: calls left times ``tokens_per_call`` (the
        caller's figure: the task's context plus the agent's expected output)."""
        left = self.steps_left(agent, tenant, step, hint)
        return Prediction(left.value * tokens_per_call, left.confidence, left.samples, left.source,
                          left.spread * tokens_per_call)

    @property
    def open_sessions(self) -> int:
        return len(self._open)
