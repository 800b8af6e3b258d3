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

The parts: :mod:`taskplane.sim.batching` (the scheduler loop: batch forming, step timing,
the events steps produce) and :mod:`taskplane.sim.engine_kv` (admission against the KV
cache, tier loads, caching and releasing blocks); this module is the engine's API.

Time semantics: a step is committed when it *starts* (its composition is then fixed);
``advance(now)`` commits every step starting at or before ``now`` and returns the
events whose time is ``<= now``. ``next_event_time()`` is when ``advance`` should next be
called for something to happen (``math.inf`` when idle).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from taskplane.sim.batching import Batcher
from taskplane.sim.engine_kv import EngineKV
from taskplane.sim.gpus import (
    default_cold_start_s,
    default_kv_blocks,
    gpu_profile,
    model_profile,
)
from taskplane.sim.hosttier import ReplicaTiers
from taskplane.sim.kvcache import KVCache
from taskplane.sim.lora import Adapters, LoraSettings
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
from taskplane.sim.roofline import StepCosts

__all__ = ["EngineConfig", "EngineEvent", "EngineStats", "Finished", "FirstToken", "KVEvents", "SimEngine",
           "SimRequest"]


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineConfig:
    """What one simulated replica is: its GPU and model, and vLLM's engine arguments."""

    gpu: str = "h100"
    model: str = "llama-3.1-8b"
    kv_blocks: int | None = None  # None: what the GPU's memory holds after the weights
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    model_loaded: bool = True  # False: the first request waits for the cold start
    cold_start_s: float | None = None  # None: the GPU's and model's
    emit_kv_events: bool = True
    emit_first_token: bool = True
    # vLLM publishes one BlockRemoved per evicted block; in-process consumers may take one per burst
    removed_per_block: bool = True
    lora: LoraSettings | None = None  # --enable-lora and its limits (None: the base model only)


class SimEngine:
    """One simulated vLLM replica. See the module docstring for the model."""

    def __init__(self, config: EngineConfig = EngineConfig(), *, tiers: ReplicaTiers | None = None) -> None:
        gpu, model, block_size = config.gpu, config.model, config.block_size
        self.config = config
        self.gpu = gpu_profile(gpu)
        self.model_name = model
        self.model = model_profile(model)
        self.block_size = block_size
        self.num_blocks = config.kv_blocks or default_kv_blocks(gpu, model, block_size)
        self.model_loaded = config.model_loaded
        self.cold_start_s = default_cold_start_s(gpu, model) if config.cold_start_s is None else config.cold_start_s
        self.kv = KVCache(self.num_blocks, block_size, emit_events=config.emit_kv_events,
                          removed_per_block=config.removed_per_block)
        self.tiers = tiers
        self.batcher = Batcher(EngineKV(self.kv, tiers), StepCosts.of(self.gpu, self.model),
                               max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
                               emit_first_token=config.emit_first_token)
        self.adapters = Adapters(config.lora) if config.lora is not None else None
        self.batcher.adapters = self.batcher.kv.adapters = self.adapters
        self.stats: EngineStats = self.batcher.stats

    # ---------------------------------------------------------------- state
    @property
    def slow_factor(self) -> float:
        """Fault injection: >1 slows every step down."""
        return self.batcher.slow_factor

    @slow_factor.setter
    def slow_factor(self, factor: float) -> None:
        self.batcher.slow_factor = factor

    @property
    def now(self) -> float:
        """When the engine's next step may start (end of the last committed step)."""
        return self.batcher.t

    @property
    def num_running(self) -> int:
        return len(self.batcher.prefilling) + self.batcher.dec.n

    @property
    def num_waiting(self) -> int:
        return len(self.batcher.waiting)

    @property
    def busy(self) -> bool:
        return self.batcher.busy

    def kv_usage(self) -> float:
        return self.kv.usage()

    def free_blocks(self) -> int:
        return self.kv.free_blocks()

    def load(self) -> tuple[int, int, int, int, int]:
        """(running, waiting, free blocks, pending prefill tokens, pending decode tokens)
        in one call: the cluster refreshes a replica's view after every change."""
        kv, b = self.kv, self.batcher
        return (
            len(b.prefilling) + b.dec.n,
            len(b.waiting),
            kv.free_uncached + kv.n_evictable,
            b.pend_prefill,
            b.dec.pending_tokens() + b.pend_out,
        )

    def generated(self, req_id: Hashable) -> int:
        """Tokens generated so far by a request still in the engine (0 if unknown)."""
        r = self.batcher.reqs.get(req_id)
        if r is None or r.state is not ReqState.DECODE:  # (a request that left is not in reqs)
            return 0
        return self.batcher.dec.generated(r)

    # ---------------------------------------------------------------- requests
    def submit(self, req: SimRequest, now: float) -> None:
        """A request arrives at ``now``. It joins the waiting queue at the next step."""
        b = self.batcher
        if req.req_id in b.reqs:
            raise ValueError(f"request id {req.req_id!r} is already in the engine")
        b.run_until(now, strict=True)
        r = EngineRequest(spec=req, arrival=now)
        r.blocks = need = -(-(req.prompt_tokens + req.output_tokens) // self.block_size)
        if req.prompt_tokens < 1 or req.output_tokens < 1 or need > self.num_blocks:
            why = "does not fit in the KV cache" if need > self.num_blocks else "empty request"
            b.emit(b.finished(r, now, f"rejected: {why}"))
            return
        if not b.busy:
            b.t = max(b.t, now)
        if not self.model_loaded:
            b.t = max(b.t, now) + self.cold_start_s
            self.model_loaded = True
        b.enqueue(r)

    def abort(self, req_id: Hashable, now: float) -> bool:
        """Drop a request (client went away); its blocks are released. False if unknown."""
        b = self.batcher
        b.run_until(now, strict=True)
        r = b.reqs.get(req_id)
        if r is None:
            return False
        b.remove(r)
        self.stats.aborted += 1
        b.flush_kv(now)
        b.emit(b.finished(r, now, "aborted"))
        return True

    def reset(self, now: float, why: str = "aborted: engine restarted") -> None:
        """A restart (or a sleep) with an empty cache: every request is aborted, AllBlocksCleared."""
        b = self.batcher
        b.run_until(now, strict=True)
        # what the step in progress would have produced after `now` dies with the engine
        later = [e for e in b.out if e.time > now]
        b.out = [e for e in b.out if e.time <= now]
        for e in later:
            if isinstance(e, Finished) and e.error is None:
                e.time, e.error = now, why
                b.out.append(e)
        for r in list(b.reqs.values()):
            r.state = ReqState.DONE
            self.stats.aborted += 1
            b.emit(b.finished(r, now, why))
        b.clear()
        b.kv.reset()
        b.flush_kv(now)
        b.t = max(b.t, now)

    # ---------------------------------------------------------------- the cache
    def clear_prefix_cache(self, now: float) -> bool:
        """vLLM's ``/reset_prefix_cache``: refused (False) while requests hold blocks."""
        self.batcher.run_until(now)
        ok = self.kv.clear_unused()
        self.batcher.flush_kv(now)
        return ok

    def prefetch(self, hashes: Sequence[int], token_ids: Sequence[int] | None, now: float) -> int:
        """Bring the blocks of ``hashes`` the KV tiers hold back into the GPU cache ahead of
        the call that will need them (cached, unreferenced, most recently used); the transfer
        is charged to a step that starts while it runs. Returns the blocks loaded (0 when
        they do not fit without evicting referenced blocks)."""
        if self.tiers is None:
            return 0
        b = self.batcher
        b.run_until(now, strict=True)
        n = b.kv.prefetch(hashes, token_ids, now, b.t)
        if n is None:
            return 0
        b.flush_kv(now)
        return n

    def receive(self, hashes: Sequence[int], token_ids: Sequence[int] | None, now: float) -> int:
        """Cache blocks computed elsewhere (a KV connector's pull from a prefill replica):
        stored unreferenced and announced as BlockStored, so the call that follows hits
        them. Returns the blocks newly stored (0 when they do not fit)."""
        b = self.batcher
        b.run_until(now, strict=True)
        kv = self.kv
        hits = kv.match(hashes, len(hashes))
        n = len(hashes) - hits
        if n <= 0 or not kv.can_allocate(hashes, hits, n):
            return 0
        hold = kv.acquire(list(hashes[:hits]))
        kv.allocate(n)
        stored = kv.store(hashes, hits, len(hashes), token_ids, hold)
        kv.release(hold, n - stored)
        b.flush_kv(now)
        return stored

    def cached_blocks(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` the GPU cache holds now."""
        return self.kv.match(hashes, len(hashes))

    def drop(self, hashes: Sequence[int], now: float) -> int:
        """Evict these blocks from the GPU now if unreferenced (a finished session)."""
        self.batcher.run_until(now, strict=True)
        n = self.kv.discard(hashes)
        self.batcher.flush_kv(now)
        return n

    def demote(self, hashes: list[int]) -> list[int]:
        """Let these blocks be the first evicted when room is needed (a session likely
        over); empty the returned list to take it back."""
        return self.kv.demote(hashes)

    # ---------------------------------------------------------------- time
    def advance(self, now: float) -> list[EngineEvent]:
        """Run the engine up to ``now``; return the events that happened by then, in order."""
        b = self.batcher
        b.run_until(now)
        out = b.out
        if not out:
            return []
        if out[-1].time <= now:
            b.out = []
            return out
        i = 0
        while i < len(out) and out[i].time <= now:
            i += 1
        ready, b.out = out[:i], out[i:]
        return ready

    def next_event_time(self) -> float:
        """When to call ``advance`` next; ``math.inf`` when there is nothing to do."""
        b = self.batcher
        if b.out:
            return b.out[0].time
        if b.decode_only():
            return b.t + b.decode_span(b.dec.steps_to_next_finish())
        # not a decode-only stretch: a step is due, unless nothing runs
        return b.t if b.busy else math.inf
