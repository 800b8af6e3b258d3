"""One call the picker routed, from its choice to its settled rows.

Envoy carries the bytes and makes the retries; the picker learns what happened from the
response headers (which endpoint served: every endpoint listed before it failed) and
from the response body or the access log (usage, the stream's end). Each attempt is
driven through the gateway's transport-neutral ``AttemptLifecycle`` (the same leases,
rows, keys, costs and scheduler feedback as the Python proxy), and each settles once,
whatever arrives twice or never.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from taskplane.calls import failures
from taskplane.calls.attempts import Attempt, response_headers
from taskplane.calls.intake import Call
from taskplane.calls.lifecycle import MAX_TRIES, AttemptLifecycle, Choice
from taskplane.calls.metrics import GatewayMetrics
from taskplane.engines.replica import ReplicaState
from taskplane.errors import ErrorType, TaskplaneError
from taskplane.store.records import Outcome

log = structlog.get_logger(__name__)


def _backdate(attempt: Attempt, since: datetime) -> None:
    """Date an attempt begun late back to when its try began (never into the future)."""
    back_s = max(0.0, (datetime.now(UTC) - since).total_seconds())
    attempt.started = datetime.now(UTC) - timedelta(seconds=back_s)
    attempt.t0 -= back_s


class PickedCall:
    """A routed call: its ordered replicas (the choice, then Envoy's fallbacks) and their attempts."""

    def __init__(self, lifecycle: AttemptLifecycle, metrics: GatewayMetrics, call: Call, choice: Choice,
                 fallbacks: list[ReplicaState], *, first_try: int = 0) -> None:
        self.lc = lifecycle
        self.metrics = metrics
        self.call = call
        self.choice = choice
        self.order = [choice.replica, *fallbacks]
        self.first_try = first_try
        self.model = choice.decision.model or call.pool.model
        self.attempts: dict[int, Attempt] = {}
        self.attempts_tried: set[int] = set()  # Envoy's tries the picker wrote (or is writing) a row for
        self.unplaced_at: int | None = None  # the row index the unplaced row took, if written
        self.served: Attempt | None = None
        self.settled = False
        self.settled_at: float | None = None  # monotonic, once settled

    @property
    def key(self) -> str:
        """The call's id in Envoy's dynamic metadata (the access log brings it back)."""
        return f"{self.call.call_id}:{self.call.ctx.attempt}"

    async def begin(self, index: int = 0, replica: ReplicaState | None = None, *, row_index: int | None = None) -> Attempt:
        """Start try ``index`` (on ``order[index]`` unless named), journalled before Envoy sends it;
        its row's key takes ``row_index`` (default: the try's own index)."""
        replica = replica or self.order[min(index, len(self.order) - 1)]
        decision = self.choice.decision
        if replica is not self.choice.replica:
            decision = dataclasses.replace(decision, replica=replica.name, gpu=replica.config.gpu, cached_blocks=0)
        at = index if row_index is None else row_index
        attempt = await self.lc.begin(self.call, decision, replica, try_index=self.first_try + at,
                                      queue_ms=self.choice.queue_ms)
        self.attempts[index] = attempt
        self.attempts_tried.add(index)
        return attempt

    def _free_row_index(self, wanted: int) -> int:
        """``wanted`` unless a row already took it (the unplaced row, written before Envoy's
        log told of a later try), else the next index no row has: every key stays unique."""
        taken = {a.try_index - self.first_try for a in self.attempts.values()}
        if self.unplaced_at is not None:
            taken.add(self.unplaced_at)
        if wanted not in taken:
            return wanted
        return max(taken) + 1

    def _replica_of_try(self, index: int, last: ReplicaState) -> ReplicaState:
        """Envoy walks the list in order; tries past its end went where its fallback policy
        sent them, which the last one (the replica that answered) stands for."""
        return self.order[index] if index < len(self.order) else last

    async def served_by(self, replica: ReplicaState | None, tries: int | None, *, since: datetime | None = None) -> Attempt | None:
        """Envoy says who answered, and (``x-envoy-attempt-count``) after how many tries:
        the tries before failed (one row each), the last is the answer. ``since``: when that
        try began, for an answer learnt only after it ended (the access log's): a try the
        picker begins now is dated back to it, so its duration and GPU time are the try's."""
        if replica is None:
            return None
        if tries is None:
            tries = next((i for i, r in enumerate(self.order) if r is replica), 0) + 1
        for i in range(tries - 1):
            await self._fail(i, self._replica_of_try(i, replica), retry=True)
        last = tries - 1
        if last not in self.attempts or self.attempts[last].replica is not replica:
            if last in self.attempts:  # begun on the list's replica, answered elsewhere
                await self.lc.failed(self.attempts.pop(last), failures.internal(self.attempts_name(last), "superseded"))
            attempt = await self.begin(last, replica)
            if since is not None:
                _backdate(attempt, since)
        self.served = self.attempts[last]
        self.served.replica.saw_progress()
        return self.served

    def attempts_name(self, index: int) -> str:
        return self.attempts[index].replica.name if index in self.attempts else "?"

    async def _fail(self, index: int, replica: ReplicaState, failure: failures.Failure | None = None, *,
                    row_index: int | None = None, retry: bool = False, cancel: bool = False) -> None:
        """Try ``index`` on ``replica`` ended without the answer (by default: no answer,
        Envoy tried the next endpoint): its row, begun now if the picker had none, counted
        as a retry if it led to one; ``cancel``: the client left during it."""
        attempt = self.attempts.get(index) or await self.begin(index, replica, row_index=row_index)
        if retry:
            self.metrics.retries.inc()
        if cancel:
            await self.lc.cancelled(attempt)
            return
        await self.lc.failed(attempt, failure or failures.unreachable(replica.name, "no answer; Envoy tried the next endpoint",
                                                                      timeout=False))

    async def exhausted(self, last: TaskplaneError) -> TaskplaneError:
        """Every try failed: the row the Python proxy writes when its next choice finds no
        replica left (the same unplaced row; none after ``MAX_TRIES`` tries, as there), and
        the error the client gets."""
        err = TaskplaneError(ErrorType.NO_REPLICA, f"all replicas failed: {last.message}", retry_after_s=1)
        if self.unplaced_at is None and self.first_try + len(self.attempts_tried) < MAX_TRIES:
            self.unplaced_at = self._free_row_index(len(self.attempts_tried))
            await self.lc.ledger.record_unplaced(self.call, err, Outcome.ERROR, try_index=self.first_try + self.unplaced_at)
        return err

    def headers(self) -> dict[str, str]:
        """The X-Taskplane-* headers known when the response starts (no cost or tokens yet)."""
        assert self.served is not None
        return self.headers_of(self.served.replica)

    def headers_of(self, replica: ReplicaState) -> dict[str, str]:
        """The X-Taskplane-* headers of an answer from ``replica`` (any endpoint listed: the
        routing answer hands them to the Lua filter before anyone knows who will answer)."""
        return {"x-taskplane-replica": replica.name, "x-taskplane-gpu": replica.config.gpu,
                "x-taskplane-queue-ms": f"{self.choice.queue_ms:.1f}", "x-taskplane-model": self.model}

    async def succeeded(self, usage: Mapping[str, Any], ttft_ms: float | None = None) -> dict[str, str]:
        """The served attempt's row with the engine's usage; returns its full response headers."""
        assert self.served is not None
        a = self.served
        if ttft_ms is not None:
            self.lc.first_token(a, ttft_ms)
        rec = await self.lc.succeeded(a, usage)
        await self.settle()
        if rec is None:
            return self.headers()
        return {k.lower(): v for k, v in response_headers(a.replica, rec, self.choice.queue_ms, self.model).items()}

    async def failed(self, failure: failures.Failure) -> None:
        """The served attempt failed (a broken body or stream, the engine's refusal)."""
        if self.served is not None:
            await self.lc.failed(self.served, failure)
        await self.settle()

    async def cancelled(self, generated_tokens: int = 0) -> None:
        """The client left mid-answer: the open attempts' rows say ``cancelled``."""
        for attempt in self.attempts.values():
            await self.lc.cancelled(attempt, generated_tokens if attempt is self.served else 0)
        await self.settle()

    async def all_failed(self, failure: failures.Failure, tried: int) -> TaskplaneError:
        """Envoy answered the client itself: every try it made failed."""
        for i in range(tried):
            await self._fail(i, self._replica_of_try(i, self.order[-1]), failure)
        err = await self.exhausted(failure.error)
        await self.settle()
        return err

    async def reconcile(self, envoy_tries: int, *, client_left: bool) -> int:
        """Envoy's access log counts the tries it made (``upstream_request_attempt_count``);
        a try the answer did not name (the client left while Envoy was on a fallback, or an
        answer without ``x-envoy-attempt-count``) reached a replica all the same and gets its
        row now: failed, or cancelled if it was the last and the client left. Its GPU time
        was charged to the tries the picker knew of (it cannot tell when the unnamed one
        began). Returns how many rows it added."""
        missing = [i for i in range(envoy_tries) if i not in self.attempts_tried]
        last_replica = self.served.replica if self.served is not None else self.order[-1]
        for i in missing:
            self.attempts_tried.add(i)  # before any await: a second log entry adds nothing
        for i in missing:
            await self._fail(i, self._replica_of_try(i, last_replica), row_index=self._free_row_index(i), retry=i > 0,
                             cancel=client_left and i == envoy_tries - 1)
        if missing:
            log.warning("envoy_tries_unnamed", call=self.key, envoy_tries=envoy_tries, added=len(missing))
        return len(missing)

    async def settle(self) -> None:
        """Close what is still open (the gateway lost track: blame nobody) and give the
        tenant's slot back, once."""
        if self.settled:
            return
        self.settled = True
        self.settled_at = time.monotonic()
        for attempt in self.attempts.values():
            if not attempt.settled:  # a settled attempt ignores it: build no failure for it
                await self.lc.failed(attempt, failures.internal(attempt.replica.name, "attempt ended without an answer"))
        self.lc.leave(self.call)
