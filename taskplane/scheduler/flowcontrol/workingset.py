"""KV working-set room (``working-set-room``): a task's first call is admitted on a replica
only while the contexts of the sessions pinned there, plus the blocks it would allocate
there, fit in its priority band's share of the KV cache. Without it, new tasks evict the
contexts of tasks paused on a tool call and every later step re-prefills its whole context.

The rule holds a first call only where holding pays (flowcontrol/holdcost.py): never while
the fleet's queues are short (a replica that can take it has no engine queue and little
queued prefill, so any re-prefill is absorbed), never when its expected wait for room is
at least the slowdown its admission would cause the others (the pinned context it would
push out, priced at the replica's prefill rate, times the calls sharing that replica), and
never longer than that slowdown: past it the call is admitted where capacity allows. The
expected wait is learned online (the waits of the calls room was found for), and before
any the queue-drain estimate. A hold that reaches ``hold_s`` with the slowdown still
larger refuses the call (it has spent nothing) with ``retry_after_s``.

A call without a task or session (a plain OpenAI client) is never held for room: it has no
later steps whose context a refusal would protect. Nor is a task's first call whose later
steps the prediction layer cannot vouch for (no hint and no history, or a confident
prediction of fewer than ``min_steps_left`` later calls): that call is treated as a plain
client's.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.flowcontrol.base import FlowPlugin
from taskplane.scheduler.flowcontrol.holdcost import queues_short, slowdown_ms
from taskplane.scheduler.framework.handle import Handle
from taskplane.scheduler.framework.normalise import any_true
from taskplane.scheduler.framework.plugin import param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.predict.model import Predictor
from taskplane.scheduler.types import CallRequest


class Room(enum.Enum):
    ADMIT = "admit"  # place over the replicas with capacity, room aside
    HOLD = "hold"
    REFUSE = "refuse"


@register("working-set-room")
class WorkingSetRoom(FlowPlugin):
    """Hold a task's first call while no replica has KV room for its context next to the
    sessions in flight, where and as long as the hold pays."""

    role = "room"

    @dataclass(slots=True)
    class Params:
        limits: dict[str, float] = param(  # noqa: RUF009 (param copies a mutable default per instance)
            {"interactive": 0.8, "standard": 0.75, "batch": 0.7},
            "per priority band, the share of a replica's KV cache the pinned contexts plus the new task's may "
            "fill (a band not listed is never held); empty: the rule is off")
        retry_after_s: float = param(30.0, "Retry-After of a first call refused for room")
        hold_s: float = param(30.0, "the longest a first call is held for room before it is refused; 0: refuse at once")
        min_budget_retries: float = param(
            2.0, "a task whose deadline budget is shorter than this many Retry-Afters is never held or refused "
            "for room (the wait alone would cost it its deadline)")
        host_share: float = param(
            0.0, "what a host-tier (CPU) KV block counts for in room against a GPU block (0: GPU room only)")
        short_queue_ms: float | None = param(
            None, "queues are short when a replica that can take the call has no engine-queued call and at "
            "most this much queued prefill (ms, by the latency model): a first call is then not held; null: off")
        min_steps_confidence: float = param(
            0.3, "a first call is held only when the prediction layer expects its task to make later calls "
            "with at least this confidence (the SDK's hint, or history); 0: hold whatever is known")
        min_steps_left: float = param(
            1.0, "a first call is held only when its task is expected to make at least this many later calls: "
            "a chat whose conversations mostly end after one turn has little later context to protect")
        pays: bool = param(
            False, "hold only while the expected wait is below the slowdown admission would cause the others, "
            "and never longer (false: hold up to hold_s whatever it costs)")

        def validate(self) -> None:
            for band, share in self.limits.items():
                if not 0.0 < float(share) <= 1.0:
                    raise ValueError(f"limits[{band!r}] must be in (0, 1], got {share}")
            if self.hold_s < 0 or self.retry_after_s <= 0 or self.host_share < 0:
                raise ValueError("hold_s >= 0, retry_after_s > 0 and host_share >= 0 are required")

    def __init__(self, params: Params, **kw: object) -> None:
        super().__init__(params, **kw)  # type: ignore[arg-type]
        self._wait_s = 0.0  # EWMA of the waits of held calls that room was found for
        self._waits = 0
        self._predictor = Predictor()

    def bind(self, handle: Handle) -> None:
        self._predictor = handle.predictor

    def _expects_later_steps(self, request: CallRequest) -> bool:
        """Whether the task is known (hinted, or learned) to make calls after this one."""
        need = self.params.min_steps_confidence
        if need <= 0:
            return True
        left = self._predictor.steps_left(request.agent or "default", request.tenant or "default",
                                          request.step or 0, request.steps_remaining)
        return left.usable(need) and left.value >= max(self.params.min_steps_left, 1e-9)

    @property
    def on(self) -> bool:
        return bool(self.params.limits)

    def limit(self, request: CallRequest, starts_task: Callable[[], bool]) -> float | None:
        """The room share for ``request`` (the pipeline's ``Load.room_limit``), or None when
        the rule does not apply to it."""
        p = self.params
        if request.session_id is None and request.task_id is None:
            return None
        if not starts_task() or not self._expects_later_steps(request):
            return None
        budget = request.budget_ms
        if budget is not None and budget < p.min_budget_retries * p.retry_after_s * 1000.0:
            return None
        return p.limits.get(request.priority)

    def blocks(self, state: CycleState) -> bool:
        """Does the rule keep the call off every candidate?"""
        room = state.room
        return room is not None and not any_true(state.c(room))

    def judge(self, state: CycleState, drain_wait_s: float, held_s: float = 0.0) -> tuple[Room, float]:
        """For a call :meth:`blocks` keeps off: admit it past the rule, hold it (and for how
        long at most), or refuse it. ``drain_wait_s``: the queue-drain estimate of its wait."""
        p = self.params
        if p.hold_s <= 0:
            return Room.REFUSE, 0.0
        free = ~state.c(state.busy)
        if not p.pays or not any_true(free):
            return (Room.REFUSE, 0.0) if held_s >= p.hold_s else (Room.HOLD, p.hold_s)
        if queues_short(state, free, p.short_queue_ms):
            return Room.ADMIT, 0.0
        overflow = state.room_overflow
        assert overflow is not None
        spared_s = float(state.c(slowdown_ms(state, overflow))[free].min()) / 1000.0
        wait_s = self._wait_s if self._waits else drain_wait_s
        if held_s == 0.0 and wait_s >= spared_s:
            return Room.ADMIT, 0.0
        if held_s >= min(spared_s, p.hold_s):
            return (Room.ADMIT, 0.0) if spared_s < p.hold_s else (Room.REFUSE, 0.0)
        return Room.HOLD, min(spared_s, p.hold_s)

    def observe_wait(self, held_s: float) -> None:
        """A held first call found room after ``held_s``."""
        self._waits += 1
        a = 1.0 / min(self._waits, 20)
        self._wait_s += a * (held_s - self._wait_s)

    @staticmethod
    def admit_past(state: CycleState) -> tuple[np.ndarray, int]:
        """The candidates with capacity, the room rule aside."""
        free = ~state.c(state.busy)
        return free, int(np.count_nonzero(free))


def no_limit(_request: CallRequest, _starts_task: Callable[[], bool]) -> float | None:
    return None


__all__ = ["Room", "WorkingSetRoom", "no_limit"]
