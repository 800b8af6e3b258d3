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
- Step time from :mod:`taskplane.sim.roofline` (a roofline per GPU generation and model,
  from :mod:`taskplane.sim.gpus`).

Simplifications (see docs/sim.md): the blocks of the whole sequence are reserved at
admission, so there is no preemption; there is no EOS (the output length is given).

Speed: a stretch of pure decode steps (no prompt work, nothing admissible waiting) is
jumped over in one go up to the next completion, with the step times summed in closed
form (context grows by the batch size each step, so the sum is an arithmetic series; see
:mod:`taskplane.sim.roofline` and :mod:`taskplane.sim.decoding`). Requests that arrive
in the middle of such a stretch join at the next step boundary.

The engine's inputs, outputs and per-request state are in :mod:`taskplane.sim.requests`
(re-exported here, where the HTTP replica and the tests import them).

Time semantics: a step is committed when it *starts* (its composition is then fixed);
``advance(now)`` commits every step starting at or before ``now`` and returns the
events whose time is ``<= now``. ``next_event_time()`` is when ``advance`` should next be
called for something to happen (``math.inf`` when idle).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Hashable, Sequence

from taskplane.sim.decoding import DecodeBatch
from taskplane.sim.gpus import (
    default_cold_start_s,
    default_kv_blocks,
    gpu_profile,
    model_profile,
)
from taskplane.sim.hosttier import ReplicaTiers
from taskplane.sim.kvcache import KVCache
from taskplane.sim.requests import (
    EngineEvent,
    EngineRequest,
    EngineStats,
    Finished,
    FirstToken,
    KVEvents,
    ReqState,
    SimRequest,
)
from taskplane.sim.roofline import StepCosts, decode_span, decode_steps_by

__all__ = ["EngineEvent", "EngineStats", "Finished", "FirstToken", "KVEvents", "SimEngine", "SimRequest"]


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
        tiers: ReplicaTiers | None = None,
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
        # host / remote KV tiers (vLLM's CPU offloading): None keeps the GPU-only engine
        self.tiers = tiers
        if tiers is not None:
            self.kv.spill = tiers.spill
        self._load_s = 0.0  # tier -> GPU transfer time the next step pays
        self._prefetch_s = 0.0  # prefetch transfers in flight, and when they end: a step
        self._prefetch_end = 0.0  # starting before that end shares the link with them
        self.slow_factor = 1.0  # fault injection: >1 slows every step down
        self.stats = EngineStats()

        self._costs = StepCosts.of(self.gpu, self.model)

        self._t = 0.0  # when the next step may start
        self._waiting: deque[EngineRequest] = deque()
        self._prefilling: list[EngineRequest] = []
        self._dec = DecodeBatch()
        self._reqs: dict[Hashable, EngineRequest] = {}
        self._out: list[EngineEvent] = []
        self._pend_prefill = 0  # prompt tokens of waiting + prefilling requests not computed yet
        self._pend_out = 0  # output tokens of waiting + prefilling requests
        # _admission's last answer: the head of the queue is asked about on every
        # next_event_time / run loop while it waits, and nothing changes in between
        self._adm_req: EngineRequest | None = None
        self._adm_ver = -1
        self._adm: tuple[int, int, bool] = (0, 0, False)

    # ---------------------------------------------------------------- public API
    @property
    def now(self) -> float:
        """When the engine's next step may start (end of the last committed step)."""
        return self._t

    @property
    def num_running(self) -> int:
        return len(self._prefilling) + self._dec.n

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        return bool(self._waiting or self._prefilling or self._dec.n)

    def kv_usage(self) -> float:
        return self.kv.usage()

    def free_blocks(self) -> int:
        return self.kv.free_blocks()

    def pending_prefill_tokens(self) -> int:
        """Prompt tokens still to compute (waiting requests count in full)."""
        return self._pend_prefill

    def pending_decode_tokens(self) -> int:
        """Output tokens still to generate."""
        return self._dec.pending_tokens() + self._pend_out

    def load(self) -> tuple[int, int, int, int, int]:
        """(running, waiting, free blocks, pending prefill tokens, pending decode tokens)
        in one call: the cluster refreshes a replica's view after every change."""
        kv = self.kv
        return (
            len(self._prefilling) + self._dec.n,
            len(self._waiting),
            kv.free_uncached + kv.n_evictable,
            self._pend_prefill,
            self._dec.pending_tokens() + self._pend_out,
        )

    def generated(self, req_id: Hashable) -> int:
        """Tokens generated so far by a request still in the engine (0 if unknown)."""
        r = self._reqs.get(req_id)
        if r is None or r.state is not ReqState.DECODE:  # (a request that left is not in _reqs)
            return 0
        return self._dec.generated(r)

    def submit(self, req: SimRequest, now: float) -> None:
        """A request arrives at ``now``. It joins the waiting queue at the next step."""
        if req.req_id in self._reqs:
            raise ValueError(f"request id {req.req_id!r} is already in the engine")
        self._run_until(now, strict=True)
        r = EngineRequest(spec=req, arrival=now)
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
        if r.state is ReqState.WAITING:
            self._waiting.remove(r)
            self._pend_prefill -= r.spec.prompt_tokens
            self._pend_out -= r.spec.output_tokens
        elif r.state is ReqState.PREFILL:
            self._prefilling.remove(r)
            self._pend_prefill -= r.spec.prompt_tokens - r.computed
            self._pend_out -= r.spec.output_tokens
            self._release(r)
        elif r.state is ReqState.DECODE:
            self._dec.abort(r)
            self._release(r)
        r.state = ReqState.DONE
        del self._reqs[req_id]
        self.stats.aborted += 1
        self._flush_kv(now)
        self._emit(self._finished(r, now, "aborted"))
        return True

    def reset(self, now: float, why: str = "aborted: engine restarted") -> None:
        """A restart (or a sleep) with an empty cache: every request is aborted, AllBlocksCleared."""
        self._run_until(now, strict=True)
        # what the step in progress would have produced after `now` dies with the engine
        later = [e for e in self._out if e.time > now]
        self._out = [e for e in self._out if e.time <= now]
        for e in later:
            if isinstance(e, Finished) and e.error is None:
                e.time, e.error = now, why
                self._out.append(e)
        for r in list(self._reqs.values()):
            r.state = ReqState.DONE
            self.stats.aborted += 1
            self._emit(self._finished(r, now, why))
        self._reqs.clear()
        self._waiting.clear()
        self._prefilling.clear()
        self._dec.clear()
        self._pend_prefill = self._pend_out = 0
        self.kv.reset()
        if self.tiers is not None:
            self.tiers.reset()
        self._flush_kv(now)
        self._t = max(self._t, now)

    def clear_prefix_cache(self, now: float) -> bool:
        """vLLM's ``/reset_prefix_cache``: refused (False) while requests hold blocks."""
        self._run_until(now)
        ok = self.kv.clear_unused()
        self._flush_kv(now)
        return ok

    def prefetch(self, hashes: Sequence[int], token_ids: Sequence[int] | None, now: float) -> int:
        """Bring the blocks of ``hashes`` the KV tiers hold back into the GPU cache ahead of
        the call that will need them (cached, unreferenced, most recently used); the transfer
        is charged to a step that starts while it runs. Returns the blocks loaded (0 when
        they do not fit without evicting referenced blocks)."""
        if self.tiers is None:
            return 0
        self._run_until(now, strict=True)
        kv = self.kv
        hits = kv.match(hashes, len(hashes))
        n = self.tiers.depth(hashes, hits, len(hashes))
        if not n or not kv.can_allocate(hashes, hits, n):
            return 0
        hold = kv.acquire(list(hashes[:hits]))
        kv.allocate(n)
        n, secs = self.tiers.load(hashes, hits, hits + n, prefetch=True)
        stored = kv.store(hashes, hits, hits + n, token_ids, hold)
        kv.release(hold, n - stored)
        self._prefetch_s += secs
        self._prefetch_end = max(self._prefetch_end, max(now, self._t) + secs)
        self._flush_kv(now)
        return n

    def drop(self, hashes: Sequence[int], now: float) -> int:
        """Evict these blocks from the GPU now if unreferenced (a finished session)."""
        self._run_until(now, strict=True)
        n = self.kv.discard(hashes)
        self._flush_kv(now)
        return n

    def demote(self, hashes: list[int]) -> list[int]:
        """Let these blocks be the first evicted when room is needed (a session likely
        over); empty the returned list to take it back."""
        return self.kv.demote(hashes)

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
            return self._t + self._decode_span(self._dec.steps_to_next_finish())
        # not a decode-only stretch: a step is due, unless nothing runs
        return self._t if self._waiting or self._prefilling or self._dec.n else math.inf

    # ---------------------------------------------------------------- internals
    def _finished(self, r: EngineRequest, t: float, error: str | None) -> Finished:
        s = r.spec
        if error is None:
            gen = s.output_tokens
        elif r.first_token is None:
            gen = 0
        else:
            gen = self._dec.generated(r)
        return Finished(req_id=s.req_id, time=t, arrival=r.arrival, admitted=r.admitted, first_token=r.first_token,
                        prompt_tokens=s.prompt_tokens, cached_tokens=r.cached, output_tokens=gen,
                        gpu_seconds=r.gpu_s, error=error, tag=s.tag, tier_load_s=r.tier_load_s)

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
            events = self.kv.take_events()
            if self.tiers is not None:
                events += self.tiers.take_events()
            self._emit(KVEvents(time=t, events=events))

    def _decode_only(self) -> bool:
        """True when the next steps are pure decode until the next completion."""
        n_dec = self._dec.n
        if self._prefilling or not n_dec:
            return False
        if not self._waiting:
            return True
        if n_dec >= self.max_num_seqs:  # num_running, as nothing is prefilling
            return True
        r, kv = self._waiting[0], self.kv
        if kv.free_uncached + kv.n_evictable >= r.blocks:
            # it fits whatever its prefix-cache hit: the lookup (cache misses over ~50 blocks
            # of a big dict) is left to _admit, where acquire then walks the same blocks warm
            return False
        return not self._admission(r)[2]

    def _admission(self, r: EngineRequest) -> tuple[int, int, bool]:
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
        dec = self._dec
        d = dec.n
        return decode_span(k, self._costs.decode_base(d), dec.context, d, self._costs.kv_read, self.slow_factor)

    def _run_until(self, now: float, strict: bool = False) -> None:
        """Commit the steps starting at or before ``now`` (strictly before with ``strict``:
        a request arriving at ``now`` then joins a step starting at ``now``)."""
        while self._t < now if strict else self._t <= now:
            if self._decode_only():
                self._decode_run(now, strict)
            elif self._waiting or self._prefilling or self._dec.n:
                self._step()
            else:  # idle
                return

    def _decode_run(self, now: float, strict: bool = False) -> None:
        """Commit the pure decode steps that start by ``now`` (all of them up to the next
        completion if it comes first)."""
        dec = self._dec
        d = dec.n
        k_max = dec.steps_to_next_finish()
        # the closed form's terms (as _decode_span has them)
        a, c0, t_kv, slow = self._costs.decode_base(d), dec.context, self._costs.kv_read, self.slow_factor
        span = now - self._t
        last = decode_span(k_max - 1, a, c0, d, t_kv, slow)
        if last < span if strict else last <= span:
            # the last step starts by now: commit through the completion
            k = k_max
            dur = decode_span(k, a, c0, d, t_kv, slow)
        else:
            k = 1  # the usual: only the step starting at now (after a completion at now)
            dur = decode_span(k, a, c0, d, t_kv, slow)
            if dur < span if strict else dur <= span:  # step 1 starts by now too
                k, dur = decode_steps_by(span, strict, k_max - 1, a, c0, d, t_kv, slow)
        dec.advance(k, dur / d)
        self._t += dur
        st = self.stats
        st.steps += k
        st.busy_s += dur
        st.generation_tokens += k * d
        if k == k_max or dec.has_aborted:  # (a partial run reaches no target)
            self._complete_decoders(self._t)

    def _step(self) -> None:
        """Commit one step with prompt work in it."""
        t0 = self._t
        bs = self.block_size
        dec = self._dec
        d = dec.n
        budget = self.max_batched - d
        chunks: list[tuple[EngineRequest, int]] = []
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
        dur = self._costs.step(p, d, dec.context, attn, self.slow_factor)
        if self._load_s:  # blocks loaded from a KV tier: the transfer competes with compute
            dur += self._load_s
            self._load_s = 0.0
        if self._prefetch_s:  # a prefetch still in flight when this step starts competes too
            if t0 < self._prefetch_end:
                dur += self._prefetch_s
            self._prefetch_s = 0.0
        t1 = t0 + dur
        share = dur / (p + d) if p + d else 0.0
        self.stats.steps += 1
        self.stats.busy_s += dur
        if d:
            dec.advance(1, share)
            self.stats.generation_tokens += d

        # prompt chunks: cache their full blocks now (vLLM caches at scheduling time)
        kv = self.kv
        done: list[EngineRequest] = []
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
        self._complete_decoders(t1)
        if done:
            keep = [r for r in self._prefilling if r.computed < r.spec.prompt_tokens]
            self._prefilling = keep
            for r in done:
                self._pend_out -= r.spec.output_tokens
                r.first_token = t1
                self.stats.generation_tokens += 1
                if self.emit_first_token:
                    self._out.append(FirstToken(req_id=r.spec.req_id, time=t1, cached_tokens=r.cached, tag=r.spec.tag))
                if r.spec.output_tokens <= 1:
                    r.join = dec.counter
                    self._complete(r, t1)
                else:
                    dec.join(r)
        self._t = t1

    def _admit(self, r: EngineRequest, t: float) -> bool:
        hits, need, ok = self._admission(r)
        if not ok:
            return False
        s = r.spec
        kv = self.kv
        held = s.block_hashes[:hits]
        r.held = kv.acquire(held if type(held) is list else list(held))  # (a list slice is a copy)
        kv.allocate(need)
        r.hits = hits
        if self.tiers is not None:
            hits = self._load_from_tiers(r, hits)
        r.cached = hits * self.block_size
        r.computed = r.cached
        self._pend_prefill -= r.cached
        r.stored_upto = hits
        r.n_alloc = need
        r.admitted = t
        r.state = ReqState.PREFILL
        st = self.stats
        st.prefix_queries += s.prompt_tokens
        st.prefix_hits += r.cached
        st.prompt_tokens += s.prompt_tokens
        return True

    def _load_from_tiers(self, r: EngineRequest, hits: int) -> int:
        """Extend a GPU hit of ``hits`` blocks by the blocks the host / remote tiers hold
        next (vLLM's offloading connector loads them into the blocks just allocated);
        returns the blocks not to recompute."""
        assert self.tiers is not None and r.held is not None
        s = r.spec
        limit = min(len(s.block_hashes), (s.prompt_tokens - 1) // self.block_size)
        n, secs = self.tiers.load(s.block_hashes, hits, limit)
        if not n:
            return hits
        r.n_stored += self.kv.store(s.block_hashes, hits, hits + n, s.token_ids, r.held)
        self._load_s += secs
        r.tier_load_s += secs
        return hits + n

    def _complete_decoders(self, t: float) -> None:
        """Complete the decoders whose last token came with the step ending at ``t``."""
        for r in self._dec.pop_finished():
            self._complete(r, t)

    def _complete(self, r: EngineRequest, t: float) -> None:
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
        r.state = ReqState.DONE
        self._reqs.pop(s.req_id, None)
        self.stats.finished += 1
        self._out.append(self._finished(r, t, None))

    def _release(self, r: EngineRequest) -> None:
        assert r.held is not None  # admitted
        self.kv.release(r.held, r.n_alloc - r.n_stored)
        r.held = None
        r.n_alloc = r.n_stored = 0
