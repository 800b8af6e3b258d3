"""The simulated vLLM engine: a pure model of one replica driven by explicit time.

No sockets, no sleeping: ``submit(req, now)``, ``advance(now)`` and
``next_event_time()`` are all there is, so the HTTP server drives it with a (scaled)
wall clock and the cluster simulator with a virtual clock, and both see the same
behaviour.

What is modelled, after vLLM's V1 scheduler:

- Continuous batching with chunked prefill: each step schedules one token for every
  decoding request, then spends what is left of ``max_num_batched_tokens`` on prompt
  chunks, first of requests already prefilling, then of waiting requests in arrival
  order (head-of-line blocking, as vLLM's FCFS policy), up to ``max_num_seqs``.
- The paged KV cache of :mod:`taskplane.sim.kvcache`: a waiting request is admitted
  when the blocks of its whole sequence (prompt + output) fit after its prefix-cache
  hit; blocks of each prompt chunk are cached (and announced) when the chunk is
  scheduled, so concurrent requests can hit blocks still being computed, as in vLLM.
  Blocks completed by generated tokens are cached when the request finishes.
- vLLM's accounting: prefix-cache queries and hits in tokens; a full hit still
  recomputes the last block (at most ``(prompt - 1) // block_size`` blocks are hit).
- Step time from :mod:`taskplane.sim.gpus` (a roofline per GPU generation and model).

Simplifications (see docs/sim.md): the blocks of the whole sequence are reserved at
admission, so there is no preemption; there is no EOS (the output length is given).

Speed: a stretch of pure decode steps (no prompt work, nothing admissible waiting) is
jumped over in one go up to the next completion, with the step times summed in closed
form (context grows by the batch size each step, so the sum is an arithmetic series).
Requests that arrive in the middle of such a stretch join at the next step boundary.

Time semantics: a step is committed when it *starts* (its composition is then fixed);
``advance(now)`` commits every step starting at or before ``now`` and returns the
events whose time is ``<= now``. ``next_event_time()`` is when ``advance`` should next be
called for something to happen (``math.inf`` when idle).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from taskplane.scheduler.kv.events import KVEvent
from taskplane.sim.gpus import (
    default_cold_start_s,
    default_kv_blocks,
    gpu_profile,
    model_profile,
)
from taskplane.sim.kvcache import Holding, KVCache

# Request states
_WAITING, _PREFILL, _DECODE, _DONE = 0, 1, 2, 3
# a decoder's heap key is (target step << _SEQ_BITS) | arrival number: one int, so popping
# compares ints, not (target, seq, request) tuples whose items each live elsewhere in memory
_SEQ_BITS = 40


@dataclass(slots=True)
class SimRequest:
    """A request as the engine sees it: block hashes and token counts, not text.

    ``block_hashes`` are the chained hashes of the prompt's full blocks
    (``prompt_tokens // block_size`` of them, or fewer). ``output_block_hashes`` are those
    of the further full blocks of prompt + output (cached at completion, so the next
    turn of a conversation can hit them). ``token_ids`` (prompt + output) only feed the
    ``token_ids`` field of BlockStored events.
    """

    req_id: Hashable
    prompt_tokens: int
    output_tokens: int
    block_hashes: Sequence[int] = ()
    output_block_hashes: Sequence[int] = ()
    token_ids: Sequence[int] | None = None
    tag: Any = None  # opaque to the engine, returned in its events


@dataclass(slots=True)
class FirstToken:
    req_id: Hashable
    time: float
    cached_tokens: int
    tag: Any = None


@dataclass(slots=True)
class Finished:
    """A request left the engine: completed (``error is None``), aborted or rejected."""

    req_id: Hashable
    time: float
    arrival: float
    admitted: float | None
    first_token: float | None
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int  # generated
    gpu_seconds: float  # this request's share of the steps it took part in
    error: str | None = None
    tag: Any = None


@dataclass(slots=True)
class KVEvents:
    """KV-cache events produced at ``time`` (vLLM publishes one batch per step)."""

    time: float
    events: list[KVEvent]


EngineEvent = FirstToken | Finished | KVEvents


@dataclass(slots=True, eq=False)
class _Req:
    spec: SimRequest
    arrival: float
    state: int = _WAITING
    admitted: float | None = None
    first_token: float | None = None
    hits: int = 0
    cached: int = 0
    computed: int = 0  # prompt tokens computed (or cached)
    stored_upto: int = 0  # prompt blocks cached so far
    held: Holding | None = None  # the cached blocks it references, once admitted
    n_alloc: int = 0  # blocks allocated to it
    n_stored: int = 0  # of those, blocks it turned into cached blocks
    join: int = 0  # decode step counter when it started decoding
    target: int = 0  # decode step counter at which it finishes
    acc0: float = 0.0  # gpu-second accumulator when it started decoding
    gpu_s: float = 0.0
    blocks: int = 0  # blocks of its whole sequence (prompt + output)


@dataclass(slots=True)
class EngineStats:
    prompt_tokens: int = 0  # prompt tokens of admitted requests (vLLM counts computed ones)
    generation_tokens: int = 0
    prefix_queries: int = 0  # tokens
    prefix_hits: int = 0  # tokens
    finished: int = 0
    aborted: int = 0
    steps: int = 0
    busy_s: float = 0.0


def _span(k: int, a: float, c0: int, d: int, t_kv: float, slow: float) -> float:
    """Duration of ``k`` pure decode steps of ``d`` requests with context ``c0`` at the first
    (it grows by ``d`` a step) and per-step cost ``a`` besides reading the KV."""
    return (k * a + t_kv * (k * c0 + d * k * (k - 1) / 2)) * slow


def _steps_by(span: float, strict: bool, k_max: int, a: float, c0: int, d: int, t_kv: float,
              slow: float) -> tuple[int, float]:
    """How many pure decode steps (1..``k_max``) start within ``span`` (strictly before its
    end with ``strict``), and their duration (see :func:`_span`)."""

    def starts(i: int) -> bool:  # does step i (0-based) start by now?
        di = _span(i, a, c0, d, t_kv, slow)
        return di < span if strict else di <= span

    # span(i) = A i^2 + B i is increasing: solve span(x) = span, then fix rounding
    qa = t_kv * d / 2 * slow
    qb = (a + t_kv * (c0 - d / 2)) * slow
    if qa > 0:
        x = (-qb + math.sqrt(qb * qb + 4 * qa * span)) / (2 * qa)
    else:
        x = span / qb
    k = min(max(int(x) + 1, 1), k_max)  # steps 0..floor(x) start by now
    while k < k_max and starts(k):
        k += 1
    while k > 1 and not starts(k - 1):
        k -= 1
    return k, _span(k, a, c0, d, t_kv, slow)


class SimEngine:
    """One simulated vLLM replica. See the module docstring for the model."""

    def __init__(
        self,
        gpu: str = "h100",
        model: str = "llama-3.1-8b",
        *,
        kv_blocks: int | None = None,
        block_size: int = 16,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        model_loaded: bool = True,
        cold_start_s: float | None = None,
        emit_kv_events: bool = True,
        emit_first_token: bool = True,
        removed_per_block: bool = True,
    ) -> None:
        self.gpu = gpu_profile(gpu)
        self.model_name = model
        self.model = model_profile(model)
        self.block_size = block_size
        self.num_blocks = kv_blocks or default_kv_blocks(gpu, model, block_size)
        self.max_num_seqs = max_num_seqs
        self.max_batched = max_num_batched_tokens
        self.model_loaded = model_loaded
        self.cold_start_s = default_cold_start_s(gpu, model) if cold_start_s is None else cold_start_s
        self.emit_first_token = emit_first_token
        self.kv = KVCache(self.num_blocks, block_size, emit_events=emit_kv_events,
                          removed_per_block=removed_per_block)
        self.slow_factor = 1.0  # fault injection: >1 slows every step down
        self.stats = EngineStats()

        g, m = self.gpu, self.model
        flops = g.peak_tflops * 1e12 * g.flops_efficiency
        bw = g.mem_bw_gbs * 1e9 * g.bw_efficiency
        self._overhead = g.step_overhead_s
        self._t_weights = m.weight_bytes / bw
        self._t_tok = m.flops_per_token / flops  # GEMM time per token in the batch
        self._t_kv = m.kv_bytes_per_token / bw  # time to read one context token's KV
        self._t_attn = m.attn_flops_per_token_ctx / flops  # per (query x context) pair

        self._t = 0.0  # when the next step may start
        self._waiting: deque[_Req] = deque()
        self._prefilling: list[_Req] = []
        self._dec_heap: list[int] = []  # heap keys of the decoders (and of aborted ones)
        self._decoders: dict[int, _Req] = {}  # heap key -> request, while in the heap
        self._n_aborted = 0  # aborted decoders still in the heap
        self._n_dec = 0
        self._dec_s0 = 0  # sum over decoders of (prompt + 1 - join): context = s0 + n_dec * counter
        self._dec_target_sum = 0
        self._counter = 0  # decode steps so far
        self._acc = 0.0  # gpu-seconds per decoding request, summed over steps
        self._seq = 0
        self._reqs: dict[Hashable, _Req] = {}
        self._out: list[EngineEvent] = []
        self._pend_prefill = 0  # prompt tokens of waiting + prefilling requests not computed yet
        self._pend_out = 0  # output tokens of waiting + prefilling requests
        # _admission's last answer: the head of the queue is asked about on every
        # next_event_time / run loop while it waits, and nothing changes in between
        self._adm_req: _Req | None = None
        self._adm_ver = -1
        self._adm: tuple[int, int, bool] = (0, 0, False)

    # ---------------------------------------------------------------- public API
    @property
    def now(self) -> float:
        """When the engine's next step may start (end of the last committed step)."""
        return self._t

    @property
    def num_running(self) -> int:
        return len(self._prefilling) + self._n_dec

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        return bool(self._waiting or self._prefilling or self._n_dec)

    def kv_usage(self) -> float:
        return self.kv.usage()

    def free_blocks(self) -> int:
        return self.kv.free_blocks()

    def pending_prefill_tokens(self) -> int:
        """Prompt tokens still to compute (waiting requests count in full)."""
        return self._pend_prefill

    def pending_decode_tokens(self) -> int:
        """Output tokens still to generate."""
        return self._dec_target_sum - self._n_dec * self._counter + self._pend_out

    def load(self) -> tuple[int, int, int, int, int]:
        """(running, waiting, free blocks, pending prefill tokens, pending decode tokens)
        in one call: the cluster refreshes a replica's view after every change."""
        kv = self.kv
        n_dec = self._n_dec
        return (
            len(self._prefilling) + n_dec,
            len(self._waiting),
            kv.free_uncached + kv.n_evictable,
            self._pend_prefill,
            self._dec_target_sum - n_dec * self._counter + self._pend_out,
        )

    def generated(self, req_id: Hashable) -> int:
        """Tokens generated so far by a request still in the engine (0 if unknown)."""
        r = self._reqs.get(req_id)
        if r is None or r.state < _DECODE:
            return 0
        return min(r.spec.output_tokens, 1 + self._counter - r.join)

    def submit(self, req: SimRequest, now: float) -> None:
        """A request arrives at ``now``. It joins the waiting queue at the next step."""
        if req.req_id in self._reqs:
            raise ValueError(f"request id {req.req_id!r} is already in the engine")
        self._run_until(now, strict=True)
        r = _Req(req, now)
        r.blocks = need = -(-(req.prompt_tokens + req.output_tokens) // self.block_size)
        if req.prompt_tokens < 1 or req.output_tokens < 1 or need > self.num_blocks:
            why = "does not fit in the KV cache" if need > self.num_blocks else "empty request"
            self._emit(self._finished(r, now, f"rejected: {why}"))
            return
        if not self.busy:
            self._t = max(self._t, now)
        if not self.model_loaded:
            self._t = max(self._t, now) + self.cold_start_s
            self.model_loaded = True
        self._reqs[req.req_id] = r
        self._waiting.append(r)
        self._pend_prefill += req.prompt_tokens
        self._pend_out += req.output_tokens

    def abort(self, req_id: Hashable, now: float) -> bool:
        """Drop a request (client went away); its blocks are released. False if unknown."""
        self._run_until(now, strict=True)
        r = self._reqs.get(req_id)
        if r is None:
            return False
        if r.state == _WAITING:
            self._waiting.remove(r)
            self._pend_prefill -= r.spec.prompt_tokens
            self._pend_out -= r.spec.output_tokens
        elif r.state == _PREFILL:
            self._prefilling.remove(r)
            self._pend_prefill -= r.spec.prompt_tokens - r.computed
            self._pend_out -= r.spec.output_tokens
            self._release(r)
        elif r.state == _DECODE:
            self._leave_decode(r)
            self._n_aborted += 1  # (it stays in the heap, skipped when popped)
            self._release(r)
        r.state = _DONE
        del self._reqs[req_id]
        self.stats.aborted += 1
        self._flush_kv(now)
        self._emit(self._finished(r, now, "aborted"))
        return True

    def reset(self, now: float) -> None:
        """A restart with an empty cache: every request is aborted, AllBlocksCleared."""
        self._run_until(now, strict=True)
        # what the step in progress would have produced after `now` dies with the engine
        later = [e for e in self._out if e.time > now]
        self._out = [e for e in self._out if e.time <= now]
        for e in later:
            if isinstance(e, Finished) and e.error is None:
                e.time, e.error = now, "aborted: engine restarted"
                self._out.append(e)
        for r in list(self._reqs.values()):
            r.state = _DONE
            self.stats.aborted += 1
            self._emit(self._finished(r, now, "aborted: engine restarted"))
        self._reqs.clear()
        self._waiting.clear()
        self._prefilling.clear()
        self._dec_heap.clear()
        self._decoders.clear()
        self._n_aborted = 0
        self._n_dec = self._dec_s0 = self._dec_target_sum = 0
        self._pend_prefill = self._pend_out = 0
        self.kv.reset()
        self._flush_kv(now)
        self._t = max(self._t, now)

    def clear_prefix_cache(self, now: float) -> bool:
        """vLLM's ``/reset_prefix_cache``: refused (False) while requests hold blocks."""
        self._run_until(now)
        ok = self.kv.clear_unused()
        self._flush_kv(now)
        return ok

    def advance(self, now: float) -> list[EngineEvent]:
        """Run the engine up to ``now``; return the events that happened by then, in order."""
        self._run_until(now)
        out = self._out
        if not out:
            return []
        if out[-1].time <= now:
            self._out = []
            return out
        i = 0
        while i < len(out) and out[i].time <= now:
            i += 1
        ready, self._out = out[:i], out[i:]
        return ready

    def next_event_time(self) -> float:
        """When to call ``advance`` next; ``math.inf`` when there is nothing to do."""
        if self._out:
            return self._out[0].time
        if self._decode_only():
            return self._t + self._decode_span((self._dec_heap[0] >> _SEQ_BITS) - self._counter)
        # not a decode-only stretch: a step is due, unless nothing runs
        return self._t if self._waiting or self._prefilling or self._n_dec else math.inf

    # ---------------------------------------------------------------- internals
    def _finished(self, r: _Req, t: float, error: str | None) -> Finished:
        s = r.spec
        if error is None:
            gen = s.output_tokens
        elif r.first_token is None:
            gen = 0
        else:
            gen = min(s.output_tokens, 1 + self._counter - r.join)
        # positional, in field order (keywords cost ~2x for a dataclass this wide)
        return Finished(s.req_id, t, r.arrival, r.admitted, r.first_token, s.prompt_tokens, r.cached,
                        gen, r.gpu_s, error, s.tag)

    def _emit(self, ev: EngineEvent) -> None:
        """Append an event keeping ``_out`` in time order (aborts at ``now`` may precede
        the end of the step in progress)."""
        out = self._out
        if not out or out[-1].time <= ev.time:
            out.append(ev)
        else:
            bisect.insort_right(out, ev, key=lambda e: e.time)

    def _flush_kv(self, t: float) -> None:
        if self.kv.events:
            self._emit(KVEvents(t, self.kv.take_events()))

    def _decode_only(self) -> bool:
        """True when the next steps are pure decode until the next completion."""
        if self._prefilling or not self._n_dec:
            return False
        if not self._waiting:
            return True
        if self._n_dec >= self.max_num_seqs:  # num_running, as nothing is prefilling
            return True
        r, kv = self._waiting[0], self.kv
        if kv.free_uncached + kv.n_evictable >= r.blocks:
            # it fits whatever its prefix-cache hit: the lookup (cache misses over ~50 blocks
            # of a big dict) is left to _admit, where acquire then walks the same blocks warm
            return False
        return not self._admission(r)[2]

    def _admission(self, r: _Req) -> tuple[int, int, bool]:
        """(prefix-cache hit blocks, new blocks needed, whether they fit now) for ``r``;
        memoised on the KV cache's version."""
        kv = self.kv
        if r is self._adm_req and kv.version == self._adm_ver:
            return self._adm
        s = r.spec
        bs = self.block_size
        limit = min(len(s.block_hashes), (s.prompt_tokens - 1) // bs)
        hits = kv.match(s.block_hashes, limit) if limit > 0 else 0
        need = r.blocks - hits
        adm = (hits, need, kv.can_allocate(s.block_hashes, hits, need))
        self._adm_req, self._adm_ver, self._adm = r, kv.version, adm
        return adm

    def _decode_span(self, k: int) -> float:
        """Duration of the next ``k`` pure decode steps (closed form)."""
        d = self._n_dec
        a = self._overhead + max(self._t_weights, d * self._t_tok)
        c0 = self._dec_s0 + d * self._counter  # context at the first of the k steps
        return _span(k, a, c0, d, self._t_kv, self.slow_factor)

    def _run_until(self, now: float, strict: bool = False) -> None:
        """Commit the steps starting at or before ``now`` (strictly before with ``strict``:
        a request arriving at ``now`` then joins a step starting at ``now``)."""
        while self._t < now if strict else self._t <= now:
            if self._decode_only():
                self._decode_run(now, strict)
            elif self._waiting or self._prefilling or self._n_dec:
                self._step()
            else:  # idle
                return

    def _decode_run(self, now: float, strict: bool = False) -> None:
        """Commit the pure decode steps that start by ``now`` (all of them up to the next
        completion if it comes first)."""
        # _decode_span's terms computed once (the same float operations)
        d = self._n_dec
        counter = self._counter
        k_max = (self._dec_heap[0] >> _SEQ_BITS) - counter
        a = self._overhead + max(self._t_weights, d * self._t_tok)
        c0 = self._dec_s0 + d * counter  # context at the first of the steps
        t_kv, slow = self._t_kv, self.slow_factor
        span = now - self._t
        k = k_max - 1  # _span(k, ...) inlined here and below (same float operations)
        last = (k * a + t_kv * (k * c0 + d * k * (k - 1) / 2)) * slow
        if last < span if strict else last <= span:
            # the last step starts by now: commit through the completion
            k = k_max
            dur = (k * a + t_kv * (k * c0 + d * k * (k - 1) / 2)) * slow
        else:
            k = 1  # the usual: only the step starting at now (after a completion at now)
            dur = (k * a + t_kv * (k * c0 + d * k * (k - 1) / 2)) * slow
            if dur < span if strict else dur <= span:  # step 1 starts by now too
                k, dur = _steps_by(span, strict, k_max - 1, a, c0, d, t_kv, slow)
        self._acc += dur / d
        self._counter = counter + k
        self._t += dur
        st = self.stats
        st.steps += k
        st.busy_s += dur
        st.generation_tokens += k * d
        if k == k_max or self._n_aborted:  # (a partial run reaches no target)
            self._pop_finished_decoders_at(self._t)

    def _step(self) -> None:
        """Commit one step with prompt work in it."""
        t0 = self._t
        bs = self.block_size
        d = self._n_dec
        budget = self.max_batched - d
        chunks: list[tuple[_Req, int]] = []
        for r in self._prefilling:
            if budget <= 0:
                break
            n = min(r.spec.prompt_tokens - r.computed, budget)
            chunks.append((r, n))
            budget -= n
        waiting = self._waiting
        while waiting and budget > 0 and self.num_running < self.max_num_seqs:
            r = waiting[0]
            if not self._admit(r, t0):
                break
            waiting.popleft()
            self._prefilling.append(r)
            n = min(r.spec.prompt_tokens - r.computed, budget)
            chunks.append((r, n))
            budget -= n

        p = 0
        attn = 0.0
        for r, n in chunks:
            p += n
            attn += n * (r.computed + n / 2)
        ctx_dec = self._dec_s0 + d * self._counter
        dur = (
            self._overhead
            + max(self._t_weights, (p + d) * self._t_tok)
            + ctx_dec * self._t_kv
            + attn * self._t_attn
        ) * self.slow_factor
        t1 = t0 + dur
        share = dur / (p + d) if p + d else 0.0
        self.stats.steps += 1
        self.stats.busy_s += dur
        if d:
            self._counter += 1
            self._acc += share
            self.stats.generation_tokens += d

        # prompt chunks: cache their full blocks now (vLLM caches at scheduling time)
        kv = self.kv
        done: list[_Req] = []
        for r, n in chunks:
            s = r.spec
            r.computed += n
            self._pend_prefill -= n
            r.gpu_s += n * share
            end = min(r.computed // bs, len(s.block_hashes))
            if end > r.stored_upto:
                assert r.held is not None  # admitted
                r.n_stored += kv.store(s.block_hashes, r.stored_upto, end, s.token_ids, r.held)
                r.stored_upto = end
            if r.computed >= s.prompt_tokens:
                done.append(r)
        self._flush_kv(t0)
        self._pop_finished_decoders_at(t1)
        if done:
            keep = [r for r in self._prefilling if r.computed < r.spec.prompt_tokens]
            self._prefilling = keep
            for r in done:
                self._pend_out -= r.spec.output_tokens
                r.first_token = t1
                self.stats.generation_tokens += 1
                if self.emit_first_token:
                    self._out.append(FirstToken(r.spec.req_id, t1, r.cached, r.spec.tag))
                if r.spec.output_tokens <= 1:
                    r.join = self._counter
                    self._complete(r, t1)
                else:
                    self._enter_decode(r)
        self._t = t1

    def _admit(self, r: _Req, t: float) -> bool:
        hits, need, ok = self._admission(r)
        if not ok:
            return False
        s = r.spec
        kv = self.kv
        held = s.block_hashes[:hits]
        r.held = kv.acquire(held if type(held) is list else list(held))  # (a list slice is a copy)
        kv.allocate(need)
        r.hits = hits
        r.cached = hits * self.block_size
        r.computed = r.cached
        self._pend_prefill -= r.cached
        r.stored_upto = hits
        r.n_alloc = need
        r.admitted = t
        r.state = _PREFILL
        st = self.stats
        st.prefix_queries += s.prompt_tokens
        st.prefix_hits += r.cached
        st.prompt_tokens += s.prompt_tokens
        return True

    def _enter_decode(self, r: _Req) -> None:
        r.state = _DECODE
        r.join = self._counter
        r.target = self._counter + r.spec.output_tokens - 1
        r.acc0 = self._acc
        self._n_dec += 1
        self._dec_s0 += r.spec.prompt_tokens + 1 - r.join
        self._dec_target_sum += r.target
        self._seq += 1
        key = r.target << _SEQ_BITS | self._seq
        heapq.heappush(self._dec_heap, key)
        self._decoders[key] = r

    def _leave_decode(self, r: _Req) -> None:
        """Remove a decoder's contribution (it stays in the heap, skipped when popped)."""
        self._n_dec -= 1
        self._dec_s0 -= r.spec.prompt_tokens + 1 - r.join
        self._dec_target_sum -= r.target
        r.gpu_s += self._acc - r.acc0

    def _pop_finished_decoders_at(self, t: float) -> None:
        heap, decoders = self._dec_heap, self._decoders
        bound = (self._counter + 1) << _SEQ_BITS  # keys below: target reached
        while heap:
            key = heap[0]
            if key < bound:
                heapq.heappop(heap)
                r = decoders.pop(key)
                if r.state == _DECODE:
                    self._leave_decode(r)
                    self._complete(r, t)
                else:  # aborted earlier
                    self._n_aborted -= 1
            elif self._n_aborted and decoders[key].state != _DECODE:  # aborted earlier
                heapq.heappop(heap)
                del decoders[key]
                self._n_aborted -= 1
            else:
                break

    def _complete(self, r: _Req, t: float) -> None:
        assert r.held is not None  # admitted
        s = r.spec
        out_hashes = s.output_block_hashes
        if out_hashes:
            # blocks completed by generated tokens become cacheable (vLLM caches them as
            # they fill; here at the end)
            n_prompt = len(s.block_hashes)
            start = max(r.stored_upto, n_prompt) - n_prompt
            parent = s.block_hashes[-1] if n_prompt else None
            r.n_stored += self.kv.store(out_hashes, start, len(out_hashes), s.token_ids, r.held,
                                        offset=n_prompt, parent=parent)
            self._flush_kv(t)
        self._release(r)
        r.state = _DONE
        self._reqs.pop(s.req_id, None)
        self.stats.finished += 1
        self._out.append(self._finished(r, t, None))

    def _release(self, r: _Req) -> None:
        assert r.held is not None  # admitted
        self.kv.release(r.held, r.n_alloc - r.n_stored)
        r.held = None
        r.n_alloc = r.n_stored = 0
