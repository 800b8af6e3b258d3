"""The simulator's small parts against brute force: the decode closed form, the decode
batch's sums, the event queue's order."""

from __future__ import annotations

import math
import random

import pytest

from taskplane.sim.decoding import DecodeBatch
from taskplane.sim.events import Event, EventQueue
from taskplane.sim.gpus import gpu_profile, model_profile
from taskplane.sim.requests import EngineRequest, ReqState, SimRequest
from taskplane.sim.roofline import StepCosts, decode_span, decode_steps_by


def test_decode_span_is_the_sum_of_its_steps() -> None:
    costs = StepCosts.of(gpu_profile("h100"), model_profile("llama-3.1-8b"))
    d, c0 = 7, 9000
    a = costs.decode_base(d)
    steps = [costs.step(0, d, c0 + d * i, 0.0, 1.0) for i in range(50)]
    assert decode_span(50, a, c0, d, costs.kv_read, 1.0) == pytest.approx(math.fsum(steps), rel=1e-12)
    assert decode_span(0, a, c0, d, costs.kv_read, 1.0) == 0.0


@pytest.mark.parametrize("strict", [False, True])
def test_decode_steps_by_counts_the_steps_that_start_in_time(strict: bool) -> None:
    rng = random.Random(3)
    costs = StepCosts.of(gpu_profile("l40s"), model_profile("llama-3.1-8b"))
    for _ in range(300):
        d, c0, k_max = rng.randrange(1, 300), rng.randrange(1, 200_000), rng.randrange(1, 400)
        slow = rng.choice([1.0, 3.0])
        a, t_kv = costs.decode_base(d), costs.kv_read
        # a span ending exactly on a step start is the case strict is about
        span = decode_span(rng.randrange(0, k_max + 2), a, c0, d, t_kv, slow) + rng.choice([0.0, 1e-4, -1e-7])
        k, dur = decode_steps_by(span, strict, k_max, a, c0, d, t_kv, slow)
        want = 1  # step 0 always counts (the caller knows it starts in time)
        while want < k_max and (decode_span(want, a, c0, d, t_kv, slow) < span if strict
                                else decode_span(want, a, c0, d, t_kv, slow) <= span):
            want += 1
        assert k == want
        assert dur == decode_span(k, a, c0, d, t_kv, slow)


def _req(prompt: int, output: int) -> EngineRequest:
    return EngineRequest(spec=SimRequest(req_id=object(), prompt_tokens=prompt, output_tokens=output), arrival=0.0)


def test_decode_batch_sums_match_the_requests_and_finish_in_target_order() -> None:
    rng = random.Random(5)
    batch = DecodeBatch()
    live: list[EngineRequest] = []
    finished: list[EngineRequest] = []
    for _ in range(400):
        if rng.random() < 0.4:
            r = _req(rng.randrange(1, 5000), rng.randrange(2, 60))
            batch.join(r)
            live.append(r)
        elif live and rng.random() < 0.1:
            r = live.pop(rng.randrange(len(live)))
            batch.abort(r)
            r.state = ReqState.DONE
        batch.advance(1, 0.5)
        done = batch.pop_finished()
        assert [r.target for r in done] == sorted(r.target for r in done)
        for r in done:
            assert r.target == batch.counter  # its last token came with this step
            assert batch.generated(r) == r.spec.output_tokens
            live.remove(r)
            finished.append(r)
        assert all(batch.generated(r) < r.spec.output_tokens for r in live)
        assert batch.n == len(live)
        assert batch.context == sum(r.spec.prompt_tokens + batch.generated(r) for r in live)
        assert batch.pending_tokens() == sum(r.spec.output_tokens - batch.generated(r) for r in live)
    assert finished and all(r.gpu_s > 0 for r in finished)


def test_event_queue_orders_by_time_then_kind_then_push_order() -> None:
    rng = random.Random(11)
    kinds = list(Event)
    initial = [(float(rng.randrange(20)), rng.choice(kinds), f"i{n}") for n in range(60)]
    q = EventQueue(initial, n_replicas=1)
    expected = sorted(((t, k, n, p) for n, (t, k, p) in enumerate(initial)), key=lambda e: e[:3])
    popped = []
    later = []
    while (entry := q.pop()) is not None:
        popped.append(entry)
        if len(later) < 40 and rng.random() < 0.5:  # push something later
            t = entry[0] + 1 + rng.randrange(3)
            kind = rng.choice(kinds)
            later.append((t, kind, 100 + len(later), f"p{len(later)}"))
            q.push(t, kind, later[-1][3])
    times = [(e[0], e[1]) for e in popped]
    assert times == sorted(times)
    assert len(popped) == len(initial) + len(later)
    # at equal (time, kind) the initial events keep the order they were given in
    initial_out = [e[3] for e in popped if e[3].startswith("i")]
    assert initial_out == [e[3] for e in expected]


def test_a_rearmed_wake_makes_the_earlier_one_stale() -> None:
    q = EventQueue([], n_replicas=2)
    q.set_wake(0, 5.0)
    q.set_wake(1, 4.0)
    q.set_wake(0, 3.0)  # re-armed earlier: the 5.0 entry is stale
    q.set_wake(1, math.inf)  # nothing to do: the 4.0 entry is stale
    out = []
    while (entry := q.pop()) is not None:
        out.append((entry[0], entry[3], q.is_live_wake(entry)))
    assert out == [(3.0, 0, True), (4.0, 1, False), (5.0, 0, False)]
