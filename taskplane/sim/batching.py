"""The simulated engine's scheduler loop: which requests each step takes and how long it lasts.

After vLLM's V1 scheduler: each step schedules one token for every decoding request, then
spends what is left of ``max_num_batched_tokens`` on prompt chunks, first of requests
already prefilling, then of waiting requests in arrival order (head-of-line blocking, as
vLLM's FCFS policy), up to ``max_num_seqs``. A step is committed when it *starts*.

A stretch of pure decode steps (no prompt work, nothing admissible waiting) is committed in
one go up to the next completion, its duration in closed form
(:func:`~taskplane.sim.roofline.decode_run`).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Hashable

from taskplane.sim.decoding import DecodeBatch
from taskplane.sim.engine_kv import EngineKV
from taskplane.sim.lora import Adapters
from taskplane.sim.requests import (
    EngineEvent,
    EngineRequest,
    EngineStats,
    Finished,
    FirstToken,
    KVEvents,
    ReqState,
)
from taskplane.sim.roofline import StepCosts, decode_run, decode_span


class Batcher:
    """The requests of one engine, its step clock and the events its steps produce."""

    def __init__(self, kv: EngineKV, costs: StepCosts, *, max_num_seqs: int, max_num_batched_tokens: int,
                 emit_first_token: bool) -> None:
        self.kv = kv
        self._cache = kv.kv
        self._costs = costs
        self.max_num_seqs = max_num_seqs
        self.max_batched = max_num_batched_tokens
        self.emit_first_token = emit_first_token
        self.slow_factor = 1.0  # fault injection: >1 slows every step down
        self.adapters: Adapters | None = None  # LoRA (--enable-lora): the batch limit, loads, slowdown
        self.stats = EngineStats()
        self.t = 0.0  # when the next step may start
        self.waiting: deque[EngineRequest] = deque()
        self.prefilling: list[EngineRequest] = []
        self.dec = DecodeBatch()
        self.reqs: dict[Hashable, EngineRequest] = {}
        self.out: list[EngineEvent] = []
        self.pend_prefill = 0  # prompt tokens of waiting + prefilling requests not computed yet
        self.pend_out = 0  # output tokens of waiting + prefilling requests

    # ---------------------------------------------------------------- requests
    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.dec.n)

    def enqueue(self, r: EngineRequest) -> None:
        """``r`` joins the waiting queue (it is scheduled from the next step on)."""
        self.reqs[r.spec.req_id] = r
        self.waiting.append(r)
        self.pend_prefill += r.spec.prompt_tokens
        self.pend_out += r.spec.output_tokens

    def remove(self, r: EngineRequest) -> None:
        """``r`` is dropped wherever it is; its blocks are released."""
        if r.state is ReqState.WAITING:
            self.waiting.remove(r)
            self.pend_prefill -= r.spec.prompt_tokens
            self.pend_out -= r.spec.output_tokens
        elif r.state is ReqState.PREFILL:
            self.prefilling.remove(r)
            self.pend_prefill -= r.spec.prompt_tokens - r.computed
            self.pend_out -= r.spec.output_tokens
            self.kv.release(r)
            self._adapter_left(r)
        elif r.state is ReqState.DECODE:
            self.dec.abort(r)
            self.kv.release(r)
            self._adapter_left(r)
        r.state = ReqState.DONE
        del self.reqs[r.spec.req_id]

    def clear(self) -> None:
        """Forget every request (an engine restart)."""
        self.reqs.clear()
        self.waiting.clear()
        self.prefilling.clear()
        self.dec.clear()
        self.pend_prefill = self.pend_out = 0

    # ---------------------------------------------------------------- events
    def finished(self, r: EngineRequest, t: float, error: str | None) -> Finished:
        s = r.spec
        if error is None:
            gen = s.output_tokens
        elif r.first_token is None:
            gen = 0
        else:
            gen = self.dec.generated(r)
        return Finished(req_id=s.req_id, time=t, arrival=r.arrival, admitted=r.admitted, first_token=r.first_token,
                        prompt_tokens=s.prompt_tokens, cached_tokens=r.cached, output_tokens=gen,
                        gpu_seconds=r.gpu_s, error=error, tag=s.tag, tier_load_s=r.tier_load_s)

    def emit(self, ev: EngineEvent) -> None:
        """Append an event keeping ``out`` in time order (aborts at ``now`` may precede
        the end of the step in progress)."""
        out = self.out
        if not out or out[-1].time <= ev.time:
            out.append(ev)
        else:
            bisect.insort_right(out, ev, key=lambda e: e.time)

    def flush_kv(self, t: float) -> None:
        events = self.kv.take_events()
        if events is not None:
            self.emit(KVEvents(time=t, events=events))

    # ---------------------------------------------------------------- the loop
    def decode_only(self) -> bool:
        """True when the next steps are pure decode until the next completion."""
        n_dec = self.dec.n
        if self.prefilling or not n_dec:
            return False
        if not self.waiting:
            return True
        if n_dec >= self.max_num_seqs:  # num_running, as nothing is prefilling
            return True
        if self.adapters is not None:  # whether a waiting request may join depends on its adapter
            return False
        r, kv = self.waiting[0], self._cache
        if kv.free_uncached + kv.n_evictable >= r.blocks:
            # it fits whatever its prefix-cache hit: the lookup (cache misses over ~50 blocks
            # of a big dict) is left to admission, where acquire then walks the same blocks warm
            return False
        return not self.kv.admission(r)[2]

    def decode_span(self, k: int) -> float:
        """Duration of the next ``k`` pure decode steps (closed form)."""
        dec = self.dec
        d = dec.n
        return decode_span(k, self._costs.decode_base(d), dec.context, d, self._costs.kv_read, self._slowdown())

    def run_until(self, now: float, strict: bool = False) -> None:
        """Commit the steps starting at or before ``now`` (strictly before with ``strict``:
        a request arriving at ``now`` then joins a step starting at ``now``)."""
        while self.t < now if strict else self.t <= now:
            if self.decode_only():
                self._decode_run(now, strict)
            elif self.waiting or self.prefilling or self.dec.n:
                self._step()
            else:  # idle
                return

    def _decode_run(self, now: float, strict: bool) -> None:
        """Commit the pure decode steps that start by ``now`` (all of them up to the next
        completion if it comes first)."""
        dec = self.dec
        d = dec.n
        k_max = dec.steps_to_next_finish()
        costs = self._costs
        k, dur = decode_run(now - self.t, strict, k_max, costs.decode_base(d), dec.context, d, costs.kv_read,
                            self._slowdown())
        dec.advance(k, dur / d)
        self.t += dur
        st = self.stats
        st.steps += k
        st.busy_s += dur
        st.generation_tokens += k * d
        if k == k_max or dec.has_aborted:  # (a partial run reaches no target)
            self._complete_decoders(self.t)

    def _step(self) -> None:
        """Commit one step with prompt work in it."""
        t0 = self.t
        dec = self.dec
        d = dec.n
        chunks, load_s = self._form_batch(t0, self.max_batched - d)
        p = 0
        attn = 0.0
        for r, n in chunks:
            p += n
            attn += n * (r.computed + n / 2)
        dur = self.kv.add_transfers(self._costs.step(p, d, dec.context, attn, self._slowdown()), t0) + load_s
        t1 = t0 + dur
        share = dur / (p + d) if p + d else 0.0
        self.stats.steps += 1
        self.stats.busy_s += dur
        if d:
            dec.advance(1, share)
            self.stats.generation_tokens += d
        done = self._compute_chunks(chunks, share)
        self.flush_kv(t0)
        self._complete_decoders(t1)
        if done:
            self._start_decoding(done, t1)
        self.t = t1

    def _form_batch(self, t0: float, budget: int) -> tuple[list[tuple[EngineRequest, int]], float]:
        """The prompt chunks of a step with ``budget`` tokens left after the decoders: the
        prefilling requests' first, then waiting requests admitted in order; and the
        seconds the step spends loading LoRA adapters into GPU slots."""
        chunks: list[tuple[EngineRequest, int]] = []
        for r in self.prefilling:
            if budget <= 0:
                break
            n = min(r.spec.prompt_tokens - r.computed, budget)
            chunks.append((r, n))
            budget -= n
        if self.adapters is not None:
            return chunks, self._admit_with_adapters(t0, budget, chunks, self.adapters)
        waiting = self.waiting
        while waiting and budget > 0 and len(self.prefilling) + self.dec.n < self.max_num_seqs:
            r = waiting[0]
            if not self._admit(r, t0):
                break
            waiting.popleft()
            self.prefilling.append(r)
            n = min(r.spec.prompt_tokens - r.computed, budget)
            chunks.append((r, n))
            budget -= n
        return chunks, 0.0

    def _admit_with_adapters(self, t0: float, budget: int, chunks: list[tuple[EngineRequest, int]],
                             adapters: Adapters) -> float:
        """Waiting requests admitted in order, as :meth:`_form_batch`, except that one whose
        adapter would exceed the batch's ``max_loras`` is skipped (it keeps its place), as in
        vLLM; returns the seconds spent loading the adapters that joined the batch."""
        waiting = self.waiting
        scheduled = set(adapters.running)
        skipped: list[EngineRequest] = []
        load_s = adapters.stall(t0)
        while waiting and budget > 0 and len(self.prefilling) + self.dec.n < self.max_num_seqs:
            r = waiting[0]
            name = r.spec.adapter
            if name is not None and not adapters.can_join(name, scheduled):
                skipped.append(waiting.popleft())
                continue
            if not self._admit(r, t0):
                break
            waiting.popleft()
            self.prefilling.append(r)
            if name is not None:
                if name not in scheduled:
                    load_s += adapters.activate(name)
                    scheduled.add(name)
                adapters.joined(name)
            n = min(r.spec.prompt_tokens - r.computed, budget)
            chunks.append((r, n))
            budget -= n
        waiting.extendleft(reversed(skipped))
        return load_s

    def _slowdown(self) -> float:
        """The step-time factor: injected slowness times the batch's LoRA slowdown."""
        if self.adapters is None:
            return self.slow_factor
        return self.slow_factor * self.adapters.slowdown()

    def _adapter_left(self, r: EngineRequest) -> None:
        if self.adapters is not None and r.spec.adapter is not None:
            self.adapters.left(r.spec.adapter)

    def _compute_chunks(self, chunks: list[tuple[EngineRequest, int]], share: float) -> list[EngineRequest]:
        """The step's prompt chunks are computed: their full blocks are cached now (vLLM
        caches at scheduling time); returns the requests whose prompt is done."""
        bs = self.kv.block_size
        done: list[EngineRequest] = []
        for r, n in chunks:
            s = r.spec
            r.computed += n
            self.pend_prefill -= n
            r.gpu_s += n * share
            self.kv.store_prompt(r, min(r.computed // bs, len(s.block_hashes)))
            if r.computed >= s.prompt_tokens:
                done.append(r)
        return done

    def _start_decoding(self, done: list[EngineRequest], t1: float) -> None:
        """The requests whose prefill ended with the step ending at ``t1`` have their first token."""
        dec = self.dec
        self.prefilling = [r for r in self.prefilling if r.computed < r.spec.prompt_tokens]
        for r in done:
            self.pend_out -= r.spec.output_tokens
            r.first_token = t1
            self.stats.generation_tokens += 1
            if self.emit_first_token:
                self.out.append(FirstToken(req_id=r.spec.req_id, time=t1, cached_tokens=r.cached, tag=r.spec.tag))
            if r.spec.output_tokens <= 1:
                r.join = dec.counter
                self._complete(r, t1)
            else:
                dec.join(r)

    def _admit(self, r: EngineRequest, t: float) -> bool:
        if not self.kv.admit(r):
            return False
        s = r.spec
        r.computed = r.cached
        self.pend_prefill -= r.cached
        r.admitted = t
        r.state = ReqState.PREFILL
        st = self.stats
        st.prefix_queries += s.prompt_tokens
        st.prefix_hits += r.cached
        st.prompt_tokens += s.prompt_tokens
        return True

    def _complete_decoders(self, t: float) -> None:
        """Complete the decoders whose last token came with the step ending at ``t``."""
        for r in self.dec.pop_finished():
            self._complete(r, t)

    def _complete(self, r: EngineRequest, t: float) -> None:
        if self.kv.store_output(r):
            self.flush_kv(t)
        self.kv.release(r)
        self._adapter_left(r)
        r.state = ReqState.DONE
        self.reqs.pop(r.spec.req_id, None)
        self.stats.finished += 1
        self.out.append(self.finished(r, t, None))
