"""The life of one call through the gateway, independent of the transport that carries it.

The Python proxy (``service.Gateway`` over FastAPI/httpx) and an Envoy ext_proc endpoint
picker both drive the same object, so every decision and every count is made in one
place. The steps, in order::

    call = lifecycle.prepare(kind, raw_body, headers)      # intake: 4xx TaskplaneError, nothing counted
    await lifecycle.admit(call)                            # the tenant's concurrency slot (or shed row + raise)
    tries = lifecycle.tries(call)                          # replicas to avoid (a client retry's previous one)
    choice = await lifecycle.choose(call, tries)           # a replica, or the refusal (its row written)
    attempt = await lifecycle.begin(call, choice.decision, choice.replica,
                                    try_index=tries.index, queue_ms=choice.queue_ms)
        # -> the replica's lease taken, the in-flight note on its way to disk; send the request now
    lifecycle.first_token(attempt)                         # (streams) TTFT; the prefill is done
    rec = await lifecycle.succeeded(attempt, usage)        # row written, scheduler told
    failure = await lifecycle.failed(attempt, failure)     # released, replica marked, row, scheduler
    await lifecycle.cancelled(attempt, generated_tokens)   # the client left: row 'cancelled'
    lifecycle.leave(call)                                  # the tenant's slot back

``succeeded``, ``failed`` and ``cancelled`` settle the attempt: the first of them to run
releases the replica's lease (``ReplicaRegistry.acquire``), writes the one row and tells
the scheduler; any later call is a no-op, so every exit path may call one. ``failed``
takes a ``failures.Failure`` (built from plain facts by ``failures.from_status``,
``unreachable``, ``broken_response``, ``broken_stream``) and returns it: ``failure.retry``
says whether to choose another replica (``tries.failed(...)``) or answer the client
with ``failure.error``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from taskplane.calls.attempts import Attempt, AttemptLedger, AttemptSink
from taskplane.calls.failures import Failure, ReplicaFault
from taskplane.calls.intake import Call, prepare_call
from taskplane.calls.metrics import GatewayMetrics
from taskplane.calls.placement import Placer
from taskplane.calls.stalls import CLOCK
from taskplane.config import GatewayConfig
from taskplane.engines.registry import ReplicaRegistry
from taskplane.engines.replica import ReplicaState
from taskplane.errors import ErrorType, TaskplaneError
from taskplane.scheduler.hashing import SessionChains
from taskplane.scheduler.types import Action, Decision
from taskplane.store.records import AttemptRecord, Outcome

log = structlog.get_logger(__name__)

#: Replicas one call may be tried on before the gateway gives up.
MAX_TRIES = 3
#: Tenant limit on calls in flight when its config names none.
DEFAULT_TENANT_CONCURRENCY = 1024


@dataclass(frozen=True, slots=True)
class Choice:
    """The replica a try goes to, and how long the call waited for it."""

    decision: Decision
    replica: ReplicaState
    queue_ms: float


@dataclass
class Tries:
    """A call's tries so far: replicas to avoid and the last failure."""

    previous: str | None  # where the client's earlier attempt of this call went
    exclude: set[str] = field(default_factory=set)
    last_error: TaskplaneError | None = None
    index: int = 0  # the try about to be made (0-based)

    def failed(self, replica: str, error: TaskplaneError) -> None:
        """A retryable failure on ``replica``: avoid it from now on."""
        self.last_error = error
        self.exclude.add(replica)
        self.index += 1


def _call_key(call: Call) -> str:
    """A client's call id within its tenant (ids are the clients' to choose)."""
    return f"{call.ctx.tenant}/{call.ctx.call_id}"


class AttemptLifecycle:
    """Intake, admission, placement and the settling of attempts (see the module docstring)."""

    def __init__(self, config: GatewayConfig, registry: ReplicaRegistry, placer: Placer, sink: AttemptSink,
                 metrics: GatewayMetrics, *, has_response_cache: bool = False) -> None:
        self.config = config
        self.registry = registry
        self.placer = placer
        self.metrics = metrics
        self.ledger = AttemptLedger(sink, metrics, placer, config.limits.request_timeout_s)
        self.has_response_cache = has_response_cache
        self.chains = SessionChains()  # sessions' latest prompt hashes (intake)
        self._tenant_inflight: dict[str, int] = {}
        self._last_replica: OrderedDict[str, str] = OrderedDict()  # call id -> replica of its latest attempt

    # ---- intake and admission --------------------------------------------
    def prepare(self, kind: str, raw: bytes, headers: Mapping[str, str]) -> Call:
        """The call behind one request, or the ``TaskplaneError`` that refuses it (see ``intake``).
        A refusal is counted in the metrics and nothing else: no row, no slot."""
        try:
            return prepare_call(self.config, self.registry, kind, raw, headers, has_response_cache=self.has_response_cache,
                                chains=self.chains)
        except TaskplaneError as exc:
            self.metrics.requests.labels(model="?", outcome=exc.error_type.value).inc()
            raise

    async def admit(self, call: Call) -> None:
        """Take one of the tenant's concurrent-call slots, or write the shed row and raise 429;
        503 while the cost writer can store rows nowhere (outbox and Postgres both failing)."""
        refusing = self.ledger.sink.refusing()
        if refusing is not None:  # serving it would leave the call unbilled
            raise TaskplaneError(ErrorType.NO_REPLICA, f"cost rows cannot be recorded now: {refusing}", retry_after_s=5)
        tenant_cfg = self.config.tenant(call.ctx.tenant)
        limit = tenant_cfg.max_concurrent if tenant_cfg else DEFAULT_TENANT_CONCURRENCY
        if self._tenant_inflight.get(call.ctx.tenant, 0) >= limit:
            over = TaskplaneError(ErrorType.OVERLOADED, f"tenant {call.ctx.tenant} has {limit} calls in flight (its limit)",
                                  retry_after_s=1)
            await self.ledger.record_unplaced(call, over, Outcome.SHED)
            raise over
        self._tenant_inflight[call.ctx.tenant] = self._tenant_inflight.get(call.ctx.tenant, 0) + 1

    def leave(self, call: Call) -> None:
        """Give the tenant's slot back (once per admitted call)."""
        left = self._tenant_inflight.get(call.ctx.tenant, 0) - 1
        if left > 0:
            self._tenant_inflight[call.ctx.tenant] = left
        else:
            self._tenant_inflight.pop(call.ctx.tenant, None)

    def tenant_inflight(self, tenant: str) -> int:
        return self._tenant_inflight.get(tenant, 0)

    # ---- placement -----------------------------------------------------
    def tries(self, call: Call) -> Tries:
        """A fresh try sequence; a client's retry avoids the replica its earlier attempt used."""
        previous = self._last_replica.get(_call_key(call)) if call.ctx.attempt > 1 and call.ctx.call_id else None
        return Tries(previous=previous, exclude={previous} if previous else set())

    async def _place(self, call: Call, exclude: set[str]) -> tuple[Decision, float]:
        t0 = time.monotonic()
        call.request.now_s = t0
        decision = await self.placer.place(call.request, exclude=exclude)
        queue_ms = (time.monotonic() - t0) * 1000.0
        self.metrics.queue.observe(queue_ms / 1000.0)
        return decision, queue_ms

    async def choose(self, call: Call, tries: Tries) -> Choice | TaskplaneError:
        """The replica for the next try, or the error that ends the call (its row written,
        the answer counted). Replicas that left the registry meanwhile use up a try."""
        while tries.index < MAX_TRIES:
            decision, queue_ms = await self._place(call, tries.exclude)
            if decision.action is Action.NO_REPLICA and tries.previous in tries.exclude and tries.last_error is None:
                tries.exclude.discard(tries.previous)  # the previous replica is the only one left: better than none
                decision, queue_ms = await self._place(call, tries.exclude)
            if decision.action is not Action.PLACE or decision.replica is None:
                exc = self._decision_error(decision, call)
                if tries.last_error is not None and decision.action is Action.NO_REPLICA:
                    exc = TaskplaneError(ErrorType.NO_REPLICA, f"all replicas failed: {tries.last_error.message}")
                outcome = Outcome.SHED if decision.action in (Action.SHED, Action.UNMEETABLE) else Outcome.ERROR
                await self.ledger.record_unplaced(call, exc, outcome, try_index=tries.index)
                self.metrics.requests.labels(model=call.pool.model, outcome=exc.error_type.value).inc()
                return exc
            replica = self.registry.replicas.get(decision.replica)
            if replica is not None:
                self._remember_replica(call, replica.name)
                return Choice(decision, replica, queue_ms)
            tries.exclude.add(decision.replica)
            tries.index += 1
        # every try failed, or named replicas that had just left the registry
        last = tries.last_error
        message = (f"{MAX_TRIES} replicas failed; last: {last.message}" if last is not None
                   else f"{MAX_TRIES} tries chose replicas that had left the pool")
        exc = TaskplaneError(ErrorType.NO_REPLICA, message, retry_after_s=1)
        if last is None:
            await self.ledger.record_unplaced(call, exc, Outcome.ERROR, try_index=MAX_TRIES - 1)
        self.metrics.requests.labels(model=call.pool.model, outcome="replica_error").inc()
        return exc

    def _decision_error(self, d: Decision, call: Call) -> TaskplaneError:
        if d.action is Action.SHED:
            return TaskplaneError(ErrorType.OVERLOADED, d.reason or "overloaded: shed by admission control",
                                  retry_after_s=d.retry_after_s or 1.0)
        if d.action is Action.UNMEETABLE:
            return TaskplaneError(ErrorType.DEADLINE_UNMEETABLE,
                                  d.reason or f"no replica can answer within the {call.ctx.budget_ms:.0f} ms budget")
        return TaskplaneError(ErrorType.NO_REPLICA, d.reason or f"no healthy replica serves {call.pool.model}",
                              retry_after_s=1.0)

    def _remember_replica(self, call: Call, replica: str) -> None:
        if not call.ctx.call_id:
            return
        key = _call_key(call)
        self._last_replica[key] = replica
        self._last_replica.move_to_end(key)
        while len(self._last_replica) > 100_000:
            self._last_replica.popitem(last=False)

    # ---- attempts ------------------------------------------------------
    async def begin(self, call: Call, decision: Decision, replica: ReplicaState, *, try_index: int,
                    queue_ms: float) -> Attempt:
        """Count the attempt on the replica (its lease) and journal it; send it once this returns.

        The prefill the replica must do is the prompt less the blocks it holds in its prefix
        cache, until the first token shows it done (as the simulator and the scheduler count
        it: whole prompts of calls already decoding made a busy replica look seconds behind)."""
        block = replica.config.block_size or replica.block_size or call.request.block_size
        hashes = call.request.block_hashes
        # the replica's KV event for the last prompt block it computes says the prefill has
        # begun (hashes of the engine's own tokens only; a prompt it holds whole has none)
        last_block = hashes[-1] if call.request.tokenized and decision.cached_blocks < len(hashes) else None
        prefill = call.prompt_tokens - decision.cached_blocks * block
        # disaggregated: the prompt is computed on the prefill replica (its lease, its KV events),
        # the decode replica only pulls it
        prefill_at = self.registry.replicas.get(decision.prefill_replica) if decision.prefill_replica else None
        pre_lease = None if prefill_at is None else self.registry.acquire(
            prefill_at, prefill_tokens=prefill, decode_tokens=1, last_block=last_block)
        if pre_lease is not None:
            prefill, last_block = 0, None
        lease = self.registry.acquire(replica, prefill_tokens=prefill, decode_tokens=call.max_tokens,
                                      last_block=last_block)
        attempt = Attempt(call=call, decision=decision, replica=replica, lease=lease, try_index=try_index,
                          queue_ms=queue_ms, model=decision.model or call.pool.model, started=datetime.now(UTC),
                          t0=CLOCK.now(), prefill_lease=pre_lease)
        self._gauge(replica)
        if prefill_at is not None:
            self._gauge(prefill_at)
        self.ledger.note_open(attempt)  # committed while the request goes out
        return attempt

    def first_token(self, attempt: Attempt, ttft_ms: float | None = None) -> None:
        """The first token came back (a stream's first content event): TTFT, prefill done."""
        if attempt.ttft_ms is None:
            attempt.ttft_ms = attempt.elapsed_ms() if ttft_ms is None else ttft_ms
            attempt.lease.prefilled()
            self._prefill_done(attempt)

    def _settle(self, attempt: Attempt) -> int | None:
        """Release the attempt's lease once; the batch it left, or None if already settled."""
        if attempt.settled:
            return None
        attempt.settled = True
        batch_end = attempt.lease.release()
        self._gauge(attempt.replica)
        self._prefill_done(attempt)
        return batch_end

    def _prefill_done(self, attempt: Attempt) -> None:
        """A disaggregated attempt's prompt is no longer the prefill replica's (idempotent)."""
        pre = attempt.prefill_lease
        if pre is not None and not pre.released:
            pre.release()
            self._gauge(pre.replica)

    def _gauge(self, replica: ReplicaState) -> None:
        self.metrics.child(self.metrics.inflight, replica.name).set(replica.inflight)

    async def succeeded(self, attempt: Attempt, usage: Mapping[str, Any]) -> AttemptRecord | None:
        """The attempt served the call; ``usage`` as the engine reported it. Returns its row
        (None if the attempt was settled already)."""
        batch_end = self._settle(attempt)
        if batch_end is None:
            return None
        total_ms = attempt.elapsed_ms()
        rec = self.ledger.success(attempt, total_ms, attempt.ttft_ms, usage, batch_end)
        self.registry.note_served(attempt.replica, rec.prompt_tokens + rec.completion_tokens)
        self.registry.mark_success(attempt.replica.name)
        self.ledger.completed(attempt.call, attempt.decision, ok=True, ttft_ms=attempt.ttft_ms, total_ms=total_ms,
                              cached=rec.cached_tokens, completion=rec.completion_tokens,
                              batch=max(attempt.batch_start, batch_end))
        await self.ledger.write(rec)
        return rec

    async def failed(self, attempt: Attempt, failure: Failure) -> Failure:
        """The one path of every failure: release, mark the replica, tell the scheduler,
        write the row. Returns ``failure``: retry elsewhere, or answer with its error."""
        batch_end = self._settle(attempt)
        if batch_end is None:
            return failure
        if failure.fault is not ReplicaFault.NONE:
            self.registry.mark_failure(attempt.replica.name, hard=failure.fault is ReplicaFault.HARD)
        total_ms = attempt.elapsed_ms()
        rec = self.ledger.failure(attempt, failure.outcome, failure.error.error_type, total_ms, batch_end, attempt.ttft_ms)
        self.ledger.completed(attempt.call, attempt.decision, ok=False, ttft_ms=None, total_ms=total_ms, cached=0)
        if not failure.retry:
            self.metrics.requests.labels(model=attempt.call.pool.model, outcome=failure.error.error_type.value).inc()
        await self.ledger.write(rec)
        return failure

    async def cancelled(self, attempt: Attempt, generated_tokens: int = 0) -> None:
        """The client went away mid-attempt: the GPU time was still spent, so the row is
        written (outcome ``cancelled``, with the tokens generated so far). The scheduler is
        told the call ended without blaming the replica, and learns nothing from its timing."""
        batch_end = self._settle(attempt)
        if batch_end is None:
            return
        total_ms = attempt.elapsed_ms()
        rec = self.ledger.failure(attempt, Outcome.CANCELLED, ErrorType.REPLICA_ERROR, total_ms, batch_end,
                                  attempt.ttft_ms)
        rec.completion_tokens = max(generated_tokens, 0)
        self.ledger.completed(attempt.call, attempt.decision, ok=True, ttft_ms=None, total_ms=total_ms, cached=0)
        self.metrics.requests.labels(model=attempt.call.pool.model, outcome=Outcome.CANCELLED.value).inc()
        await self.ledger.write(rec)
