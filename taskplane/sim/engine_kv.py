"""The simulated engine's side of its KV memory: the paged GPU cache and the tiers below it.

What a request does to the cache, from admission to release: the prefix-cache hit and
whether its whole sequence fits (memoised, as the head of the queue is asked about on
every step while it waits), the blocks the host / remote tiers hold past that hit (loaded
instead of recomputed), its computed blocks cached as they are scheduled, and its
references given back when it ends. Transfers from a tier are charged to the step that
starts while they run (:meth:`EngineKV.add_transfers`).
"""

from __future__ import annotations

from collections.abc import Sequence

from taskplane.scheduler.kv.events import KVEvent
from taskplane.sim.hosttier import ReplicaTiers
from taskplane.sim.kvcache import KVCache
from taskplane.sim.lora import Adapter, Adapters
from taskplane.sim.requests import EngineRequest, SimRequest


class EngineKV:
    """One engine's KV cache and tiers, as its scheduler loop uses them."""

    __slots__ = ("_adm", "_adm_req", "_adm_ver", "_load_s", "_prefetch_end", "_prefetch_s", "adapters", "block_size", "kv",
                 "tiers")

    def __init__(self, kv: KVCache, tiers: ReplicaTiers | None) -> None:
        self.kv = kv
        self.block_size = kv.block_size
        # host / remote KV tiers (vLLM's CPU offloading): None keeps the GPU-only engine
        self.tiers = tiers
        if tiers is not None:
            kv.spill = tiers.spill
        self.adapters: Adapters | None = None  # LoRA: the adapters BlockStored events name
        self._load_s = 0.0  # tier -> GPU transfer time the next step pays
        self._prefetch_s = 0.0  # prefetch transfers in flight, and when they end: a step
        self._prefetch_end = 0.0  # starting before that end shares the link with them
        # admission's last answer: the head of the queue is asked about on every
        # next_event_time / run loop while it waits, and nothing changes in between
        self._adm_req: EngineRequest | None = None
        self._adm_ver = -1
        self._adm: tuple[int, int, bool] = (0, 0, False)

    def admission(self, r: EngineRequest) -> tuple[int, int, bool]:
        """(prefix-cache hit blocks, new blocks needed, whether they fit now) for ``r``;
        memoised on the KV cache's version."""
        kv = self.kv
        if r is self._adm_req and kv.version == self._adm_ver:
            return self._adm
        s = r.spec
        limit = min(len(s.block_hashes), (s.prompt_tokens - 1) // self.block_size)
        hits = kv.match(s.block_hashes, limit) if limit > 0 else 0
        need = r.blocks - hits
        adm = (hits, need, kv.can_allocate(s.block_hashes, hits, need))
        self._adm_req, self._adm_ver, self._adm = r, kv.version, adm
        return adm

    def admit(self, r: EngineRequest) -> bool:
        """Give ``r`` its blocks if they fit: its prefix-cache hit referenced, the rest
        allocated, the tiers' blocks past the hit loaded. Sets ``r.cached`` (tokens not to
        compute), ``r.stored_upto`` and ``r.n_alloc``; False (nothing changed) if they do not fit."""
        hits, need, ok = self.admission(r)
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
        r.stored_upto = hits
        r.n_alloc = need
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

    def add_transfers(self, dur: float, t0: float) -> float:
        """A step starting at ``t0`` of compute time ``dur``, plus the tier transfers it shares
        the replica with: the loads of the requests it admitted, and a prefetch still in flight."""
        if self._load_s:  # blocks loaded from a KV tier: the transfer competes with compute
            dur += self._load_s
            self._load_s = 0.0
        if self._prefetch_s:  # a prefetch still in flight when this step starts competes too
            if t0 < self._prefetch_end:
                dur += self._prefetch_s
            self._prefetch_s = 0.0
        return dur

    def _lora(self, s: SimRequest) -> Adapter | None:
        """The adapter ``s`` runs with, as the BlockStored events name it."""
        if s.adapter is None or self.adapters is None:
            return None
        return self.adapters.registered.get(s.adapter)

    def store_prompt(self, r: EngineRequest, end: int) -> None:
        """Cache ``r``'s prompt blocks up to ``end`` (computed, or being computed by the step)."""
        if end > r.stored_upto:
            assert r.held is not None  # admitted
            s = r.spec
            r.n_stored += self.kv.store(s.block_hashes, r.stored_upto, end, s.token_ids, r.held, lora=self._lora(s))
            r.stored_upto = end

    def store_output(self, r: EngineRequest) -> bool:
        """Cache the blocks ``r``'s generated tokens completed (vLLM caches them as they
        fill; here at the end); False when its output completes no block."""
        assert r.held is not None  # admitted
        s = r.spec
        out_hashes = s.output_block_hashes
        if not out_hashes:
            return False
        n_prompt = len(s.block_hashes)
        start = max(r.stored_upto, n_prompt) - n_prompt
        parent = s.block_hashes[-1] if n_prompt else None
        r.n_stored += self.kv.store(out_hashes, start, len(out_hashes), s.token_ids, r.held,
                                    offset=n_prompt, parent=parent, lora=self._lora(s))
        return True

    def release(self, r: EngineRequest) -> None:
        """``r`` left: its references are dropped and its un-hashed blocks freed."""
        assert r.held is not None  # admitted
        self.kv.release(r.held, r.n_alloc - r.n_stored)
        r.held = None
        r.n_alloc = r.n_stored = 0

    def prefetch(self, hashes: Sequence[int], token_ids: Sequence[int] | None, now: float,
                 step_start: float) -> int | None:
        """Load the blocks of ``hashes`` the tiers hold into the GPU cache (cached,
        unreferenced, most recently used); the transfer runs from ``max(now, step_start)``.
        Returns the blocks loaded; None, the cache untouched, when the tiers hold none or
        they do not fit without evicting referenced blocks."""
        if self.tiers is None:
            return None
        kv = self.kv
        hits = kv.match(hashes, len(hashes))
        n = self.tiers.depth(hashes, hits, len(hashes))
        if not n or not kv.can_allocate(hashes, hits, n):
            return None
        hold = kv.acquire(list(hashes[:hits]))
        kv.allocate(n)
        n, secs = self.tiers.load(hashes, hits, hits + n, prefetch=True)
        stored = kv.store(hashes, hits, hits + n, token_ids, hold)
        kv.release(hold, n - stored)
        self._prefetch_s += secs
        self._prefetch_end = max(self._prefetch_end, max(now, step_start) + secs)
        return n

    def take_events(self) -> list[KVEvent] | None:
        """The cache's events since last asked, with the host tier's (None when the GPU
        cache has none: the tier's wait for the next batch)."""
        if not self.kv.events:
            return None
        events = self.kv.take_events()
        if self.tiers is not None:
            events += self.tiers.take_events()
        return events

    def reset(self) -> None:
        """An engine restart: the GPU cache and the host tier are emptied."""
        self.kv.reset()
        if self.tiers is not None:
            self.tiers.reset()
