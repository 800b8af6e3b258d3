"""The transport-neutral attempt lifecycle: every attempt settles once, whichever exit
path runs first, and gives the replica's in-flight counts back (the scheduler core and
the registry are real; the sink keeps rows in memory, as the cost writer's interface)."""

from __future__ import annotations

import asyncio
import json

from taskplane.calls import failures
from taskplane.calls.attempts import AttemptSink
from taskplane.calls.lifecycle import AttemptLifecycle, Choice
from taskplane.calls.metrics import GatewayMetrics
from taskplane.calls.wiring import build_placer
from taskplane.config import GatewayConfig
from taskplane.engines.registry import ReplicaRegistry
from taskplane.errors import ErrorType
from taskplane.store.records import AttemptRecord, Outcome


class MemorySink(AttemptSink):
    def __init__(self, *, fail_open: BaseException | None = None) -> None:
        self.rows: list[AttemptRecord] = []
        self.notes: dict[str, str] = {}
        self.fail_open = fail_open

    async def record_attempt(self, rec: AttemptRecord) -> None:
        self.rows.append(rec)
        self.notes.pop(rec.attempt_key, None)

    async def open_attempt(self, attempt_key: str, note: str) -> None:
        if self.fail_open is not None:
            raise self.fail_open
        self.notes[attempt_key] = note


def _config() -> GatewayConfig:
    return GatewayConfig.model_validate({
        "auth": False,
        "pools": [{"model": "m", "replicas": [{"url": "http://127.0.0.1:1", "name": "r0"},
                                              {"url": "http://127.0.0.1:2", "name": "r1"}]}],
    })


def _lifecycle(sink: AttemptSink) -> AttemptLifecycle:
    config = _config()
    registry = ReplicaRegistry(config)
    return AttemptLifecycle(config, registry, build_placer(config, registry), sink, GatewayMetrics())


def _body(text: str = "hello there") -> bytes:
    return json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": text}]}).encode()


async def _begun(lc: AttemptLifecycle, call_id: str = "c1"):  # type: ignore[no-untyped-def]
    call = lc.prepare("chat", _body(), {"x-taskplane-call-id": call_id})
    await lc.admit(call)
    tries = lc.tries(call)
    choice = await lc.choose(call, tries)
    assert isinstance(choice, Choice)
    attempt = await lc.begin(call, choice.decision, choice.replica, try_index=tries.index, queue_ms=choice.queue_ms)
    return call, tries, choice, attempt


def test_lease_releases_once_and_keeps_its_batch() -> None:
    registry = ReplicaRegistry(_config())
    r0 = registry.replicas["r0"]
    first = registry.acquire(r0, prefill_tokens=100, decode_tokens=8)
    second = registry.acquire(r0, prefill_tokens=-5, decode_tokens=4)  # a fully cached prompt: no prefill
    assert (r0.inflight, r0.inflight_prompt_tokens, r0.inflight_decode_tokens) == (2, 100, 12)
    assert (first.batch_start, second.batch_start) == (1, 2)
    first.prefilled()
    first.prefilled()
    assert r0.inflight_prompt_tokens == 0
    assert first.release() == 2
    assert first.release() == 2  # idempotent: the same batch, no second decrement
    with second:
        pass
    assert (r0.inflight, r0.inflight_prompt_tokens, r0.inflight_decode_tokens) == (0, 0, 0)
    assert registry.inflight_total() == 0


async def test_failure_settles_once_and_says_retry() -> None:
    sink = MemorySink()
    lc = _lifecycle(sink)
    call, tries, choice, attempt = await _begun(lc)
    await asyncio.sleep(0)  # the note joins the next commit while the request goes out
    assert lc.registry.inflight_total() == 1 and len(sink.notes) == 1
    failure = await lc.failed(attempt, failures.from_status(choice.replica.name, 503, b"busy"))
    assert failure.retry and failure.error.error_type is ErrorType.REPLICA_ERROR
    await lc.failed(attempt, failures.from_status(choice.replica.name, 503, b"busy"))
    assert await lc.succeeded(attempt, {"completion_tokens": 3}) is None  # already settled
    await lc.cancelled(attempt, 3)
    assert [r.outcome for r in sink.rows] == [Outcome.ERROR]
    assert lc.registry.inflight_total() == 0 and not sink.notes
    tries.failed(choice.replica.name, failure.error)
    again = await lc.choose(call, tries)
    assert isinstance(again, Choice) and again.replica.name != choice.replica.name
    lc.leave(call)
    assert lc.tenant_inflight(call.ctx.tenant) == 0


async def test_engine_refusal_is_answered_not_retried() -> None:
    sink = MemorySink()
    lc = _lifecycle(sink)
    _call, _tries, choice, attempt = await _begun(lc)
    body = json.dumps({"error": {"message": "bad logit_bias"}}).encode()
    failure = await lc.failed(attempt, failures.from_status(choice.replica.name, 400, body))
    assert not failure.retry and failure.error.error_type is ErrorType.INVALID_REQUEST
    assert "bad logit_bias" in failure.error.message
    assert choice.replica.consecutive_failures == 0  # the request was at fault, not the replica


async def test_cancelled_row_has_the_generated_tokens() -> None:
    sink = MemorySink()
    lc = _lifecycle(sink)
    _call, _tries, _choice, attempt = await _begun(lc)
    lc.first_token(attempt)
    await lc.cancelled(attempt, generated_tokens=5)
    (row,) = sink.rows
    assert row.outcome is Outcome.CANCELLED and row.completion_tokens == 5 and row.ttft_ms is not None
    assert lc.registry.inflight_total() == 0


async def test_success_row_and_counters() -> None:
    sink = MemorySink()
    lc = _lifecycle(sink)
    _call, _tries, choice, attempt = await _begun(lc)
    rec = await lc.succeeded(attempt, {"prompt_tokens": 12, "completion_tokens": 7})
    assert rec is not None and rec.outcome is Outcome.SUCCESS and rec.completion_tokens == 7
    assert choice.replica.served_tokens == 19
    assert lc.registry.inflight_total() == 0


async def test_a_journal_that_fails_costs_the_note_not_the_attempt() -> None:
    sink = MemorySink(fail_open=OSError("database or disk is full"))
    lc = _lifecycle(sink)
    _call, _tries, _choice, attempt = await _begun(lc)
    await lc.succeeded(attempt, {"completion_tokens": 2})
    assert [r.outcome for r in sink.rows] == [Outcome.SUCCESS] and not sink.notes
    assert lc.registry.inflight_total() == 0


async def test_a_row_waits_for_its_note() -> None:
    """The note is committed while the request goes out; an attempt that ends at once still
    closes its note (the row never precedes it)."""
    sink = MemorySink()
    lc = _lifecycle(sink)
    _call, _tries, _choice, attempt = await _begun(lc)
    await lc.cancelled(attempt)  # no await between begin and the end
    assert [r.outcome for r in sink.rows] == [Outcome.CANCELLED]
    assert not sink.notes, "the note was opened after its row closed it"


async def test_a_disaggregated_attempt_counts_its_prompt_on_the_prefill_replica() -> None:
    """With ``Decision.prefill_replica`` set, the prompt is the prefill replica's to compute
    (its lease, until the first token), the decode replica only generates; both leases are
    given back."""
    lc = _lifecycle(MemorySink())
    call = lc.prepare("chat", _body("a long prompt " * 40), {"x-taskplane-call-id": "pd1"})
    await lc.admit(call)
    tries = lc.tries(call)
    choice = await lc.choose(call, tries)
    assert isinstance(choice, Choice)
    decode = choice.replica
    prefill = next(r for name, r in lc.registry.replicas.items() if name != decode.name)
    choice.decision.prefill_replica = prefill.name
    attempt = await lc.begin(call, choice.decision, decode, try_index=tries.index, queue_ms=0.0)
    assert (prefill.inflight, prefill.inflight_prompt_tokens) == (1, call.prompt_tokens)
    assert (decode.inflight, decode.inflight_prompt_tokens, decode.inflight_decode_tokens) == (1, 0, 8)
    lc.first_token(attempt)
    assert (prefill.inflight, prefill.inflight_prompt_tokens) == (0, 0)
    await lc.succeeded(attempt, {"prompt_tokens": call.prompt_tokens, "completion_tokens": 8})
    assert lc.registry.inflight_total() == 0
