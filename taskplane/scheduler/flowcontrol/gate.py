"""One prefill at a time on a session's replica (``prefill-gate``).

An engine step takes every waiting prompt its token budget fits (vLLM's chunked prefill,
the simulated engine alike), and each of them gets its first token only when the shared
step ends. Two prompts that reach one replica together therefore both wait for both: the
first one's TTFT grows by the second's whole prefill. Holding the second until the first
one's first token makes the first as fast as on an idle replica and costs the second
almost nothing: its prefill still ends once both prompts are computed, one step's fixed
overhead later. For a call that must go to that replica -- a session whose context is
there -- holding is so never worse by more than that overhead.

Bursts make it common: on the Mooncake trace (requests arrive in 3-second slots, ~10 at
a time) the later turns of two sessions pinned to one replica met in one step for a
third of the later turns near the median, losing 17 ms each.

The gate holds such calls per replica while the replica has prompt tokens in flight
(dispatched, not yet prefilled); flow control's ``release`` hands out the head of a
replica's line once its in-flight prefill is done: the most urgent priority band first,
then first come first served (a critical call never waits behind batch calls). Where the
replica's KV events tell (the gateway, ``ReplicaView.unstarted_prefill_tokens``), "done"
is "begun": an engine publishes a prompt's blocks as it schedules them, and a prompt that
arrives while that step runs cannot join it anyway, so the held call goes then, sparing
it the rest of the step and (on taskplane's Envoy, which reports a first token only when
the stream ends) the stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskplane.scheduler.flowcontrol.base import FlowPlugin
from taskplane.scheduler.framework.plugin import param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.types import CallRequest, Decision, Priority, ReplicaView

band_rank = Priority.rank_of


def waiting_prefill(view: ReplicaView) -> int:
    """Prompt tokens dispatched to the replica whose prefill has not begun (what the gate
    waits for): the replica's KV events say, else every prompt not yet prefilled counts."""
    unstarted = view.unstarted_prefill_tokens
    return view.inflight_prefill_tokens if unstarted is None else unstarted


@dataclass(slots=True)
class Gated:
    call: CallRequest
    decision: Decision  # made when the call came; handed out unchanged
    since_s: float
    order: tuple[int, int]  # (priority band, arrival): the line's order


class PrefillGate:
    """Per replica, the placed calls held until its in-flight prefill is done."""

    def __init__(self) -> None:
        self._lines: dict[str, list[Gated]] = {}
        self._n = 0
        self._seq = 0

    def __len__(self) -> int:
        return self._n

    def holds(self, replica: str) -> bool:
        """Calls are waiting for ``replica`` (a new one joins the end of the line)."""
        return bool(self._lines.get(replica))

    def hold(self, call: CallRequest, decision: Decision, now_s: float) -> None:
        """Hold ``call``, placed by ``decision``, in the line of its replica."""
        assert decision.replica is not None
        self._seq += 1
        gated = Gated(call, decision, now_s, (band_rank(call.priority), self._seq))
        self._lines.setdefault(decision.replica, []).append(gated)
        self._n += 1

    def ready(self, table: ReplicaTable, now_s: float, max_hold_s: float) -> list[Gated]:
        """Take the head of every line whose replica has no prefill in flight (or is gone:
        the call is dispatched there and fails over as any call to a lost replica), and
        every call held ``max_hold_s`` or longer (a prefill that never clears holds no
        line for ever)."""
        out = []
        for name, line in self._lines.items():
            if not line:
                continue
            row = table.row_of(name)
            overdue = [g for g in line if now_s - g.since_s >= max_hold_s]
            if row is None or waiting_prefill(table.views[row]) <= 0:
                head = min(line, key=lambda g: g.order)
                overdue = [head, *(g for g in overdue if g is not head)]
            for g in overdue:
                line.remove(g)
                out.append(g)
                self._n -= 1
        return out

    def remove(self, call: CallRequest) -> bool:
        """Drop a held call (its client went away)."""
        for line in self._lines.values():
            for g in line:
                if g.call is call:
                    line.remove(g)
                    self._n -= 1
                    return True
        return False

    def depths(self) -> dict[str, dict[str, int]]:
        """Held calls per model and priority band."""
        out: dict[str, dict[str, int]] = {}
        for line in self._lines.values():
            for g in line:
                bands = out.setdefault(g.call.model, {})
                bands[g.call.priority] = bands.get(g.call.priority, 0) + 1
        return out


@register("prefill-gate")
class PrefillGatePlugin(FlowPlugin):
    """Hold a placement on a replica with prompt tokens in flight until that prefill is
    done, so two prompts never share one engine step's wait for their first tokens."""

    role = "gate"

    @dataclass(slots=True)
    class Params:
        enabled: bool = param(True, "false: a placement is dispatched at once")
        min_replicas: int = param(
            8, "only in pools of at least this many replicas (smaller pools measured worse with the gate)")
        max_hold_ms: float = param(
            2000.0, "the longest a call is held: a replica whose prefill never clears holds no line for ever")
        min_tokens: int = param(
            128, "only a call with at least this many prompt tokens to compute (shorter prefills share a step "
            "at less cost than one turn of the control loop)")

    def __init__(self, params: Params, **kw: object) -> None:
        super().__init__(params, **kw)  # type: ignore[arg-type]
        self.gate = PrefillGate()

    def applies(self, pool_size: int) -> bool:
        return self.params.enabled and pool_size >= self.params.min_replicas

    def holds_call(self, req: CallRequest, decision: Decision, view: ReplicaView | None, pool_size: int) -> bool:
        """Should this placement wait in its replica's line? (then it is held)"""
        if decision.replica is None or not self.applies(pool_size):
            return False
        if req.prompt_tokens - decision.cached_blocks * req.block_size < self.params.min_tokens:
            return False
        if view is None or (waiting_prefill(view) <= 0 and not self.gate.holds(decision.replica)):
            return False
        return True
