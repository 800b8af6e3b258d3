"""What follows an attempt in the cluster simulator: the task's next call, a retry of the
call, or the end of the task (succeeded, failed, or past its deadline).

A closed-loop task issues its calls one after another (call ``k+1`` ``gap_s`` after call
``k`` succeeded); an open-loop task's calls arrive at fixed times and it ends when each
has succeeded or failed. A failed attempt is retried after a delay while attempts remain
and the retry would start before the task's deadline; otherwise the call fails, and
with it a closed-loop task.
"""

from __future__ import annotations

from taskplane.sim.calls import SimCall, TaskState
from taskplane.sim.events import Event, EventQueue
from taskplane.store.records import TaskStatus

_DEADLINE_ERRORS = ("deadline_unmeetable", "deadline_exceeded")


class Lifecycle:
    """Moves tasks and calls on after each attempt; arrivals go to the event queue."""

    __slots__ = ("events", "max_attempts")

    def __init__(self, events: EventQueue, max_attempts: int) -> None:
        self.events = events
        self.max_attempts = max_attempts

    def call_succeeded(self, call: SimCall, t: float) -> None:
        """The call's attempt succeeded at ``t``: issue the next call or end the task."""
        task = call.task
        spec = task.spec
        task.done_calls += 1
        if spec.open_loop:
            if task.done_calls >= len(spec.calls):
                finish_task(task, t)
            return
        task.ctx += call.output_tokens
        k = call.step + 1
        if k >= len(spec.calls):
            finish_task(task, t)
            return
        t_next = t + spec.calls[k].gap_s
        if task.deadline_abs is not None and t_next > task.deadline_abs:
            end_task(task, task.deadline_abs, TaskStatus.FAILED_DEADLINE, "deadline passed between steps")
            return
        self.events.push(t_next, Event.ARRIVAL, (task, k))

    def retry_or_fail(self, call: SimCall, t: float, after_s: float, why: str, avoid: str | None = None) -> None:
        """The call's attempt failed at ``t`` (``why``): offer it again ``after_s`` later as
        its next attempt (never on ``avoid``), or fail it."""
        task = call.task
        t_retry = t + after_s
        if call.attempt >= self.max_attempts or (task.deadline_abs is not None and t_retry > task.deadline_abs):
            fail_call(call, t, why)
            return
        task.retries += 1
        call.attempt += 1
        call.key = f"{task.spec.task_id}:{call.step}:{call.attempt}"
        call.dispatched_s = None
        call.replica = -1
        if avoid is not None and avoid not in call.avoid:
            call.avoid = (*call.avoid, avoid)
        self.events.push(t_retry, Event.ARRIVAL, call)


def fail_call(call: SimCall, t: float, why: str) -> None:
    """The call failed for good: a closed-loop task ends with it; an open-loop one when
    its last call is settled."""
    task = call.task
    status = TaskStatus.FAILED_DEADLINE if why in _DEADLINE_ERRORS else TaskStatus.FAILED
    if task.spec.open_loop:
        task.failed = task.failed or why
        task.done_calls += 1
        if task.done_calls >= len(task.spec.calls):
            end_task(task, t, status, why)
        return
    end_task(task, t, status, why)


def finish_task(task: TaskState, t: float) -> None:
    """Every call of the task is settled at ``t``."""
    if task.failed:
        end_task(task, t, TaskStatus.FAILED, task.failed)
    elif task.deadline_abs is not None and t > task.deadline_abs:
        end_task(task, t, TaskStatus.FAILED_DEADLINE, "finished after its deadline")
    else:
        end_task(task, t, TaskStatus.SUCCEEDED, None)


def end_task(task: TaskState, t: float, status: TaskStatus, error: str | None) -> None:
    """The task ends at ``t`` (the first end wins)."""
    if task.status is not None:
        return
    task.status, task.finished_s, task.failed = status, t, error
    task.hashes = []  # free memory: finished tasks keep only their records
    task.contents = []
