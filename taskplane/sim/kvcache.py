"""A paged KV cache with chained block hashes, prefix reuse and LRU eviction, as vLLM's.

Only what placement can observe is modelled: which block hashes are cached, how many
physical blocks are free, and the events vLLM publishes when that changes. There are
no block ids: a cached block *is* its hash (vLLM keeps one cached block per hash).

Free blocks are of two kinds, as in vLLM's free queue: never-used (or un-hashed)
blocks, handed out first, and cached blocks nobody references (evictable), kept in
LRU order and evicted oldest first. A request releases its blocks tail first, so the
end of a prompt is evicted before its shared beginning (vLLM frees in reverse order
for the same reason).

Speed: a request's blocks are typically a short prefix shared with other requests
followed by many blocks only it holds, which become evictable together when it ends and
are re-acquired together by the conversation's next turn; few are ever evicted. So
a block held by one request alone is not reference-counted but *owned*: its ``ref``
entry is minus the request's stamp (its :class:`Holding`), and it is evictable iff that
request has ended. Releasing a request then touches only its counted blocks; its
block list becomes a *run* of the lazy LRU queue, walked tail first, in which an entry
is live iff ``ref`` still holds the run's stamp (acquiring a block elsewhere leaves a
stale entry). A run with no live entry left is dropped whole. Acquire is one plain loop
over the hit blocks (cheaper, measured, than several C-level passes over ~50 of them).

The next turn of a conversation usually hits its previous turn's whole run: a few shared
blocks (a system prompt others hold) and then blocks still owned by that ended run. Those
owned blocks are not looked up one by one (cold entries of a big dict: most of the cost of
a lookup): :meth:`match` recognises the run from one probe (the request's leading hashes
*are* the run's list, and the run's live count says which of its entries are still owned),
and :meth:`acquire` then *adopts* the run: the request takes over the run's stamp, so those
blocks are its own without touching their ``ref`` entries. Stamps are otherwise unique.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice, takewhile

from taskplane.scheduler.kv.events import AllBlocksCleared, BlockRemoved, KVEvent
from taskplane.sim.blocks import stored_event
from taskplane.sim.kvruns import EvictableRuns, tail_first_run
from taskplane.sim.lora import Adapter


@dataclass(slots=True, eq=False)
class Holding:
    """The cached blocks one request references, from admission to release."""

    stamp: int
    blocks: list[int]  # in request order (acquired prefix, then stored ones)
    counted: list[int] = field(default_factory=list)  # those whose reference is counted
    owned: int = 0  # those it holds alone: ``ref`` is ``-stamp``
    repeated: bool = False  # a hash occurs twice: release takes the general path


class KVCache:
    """Block accounting and prefix lookup for one replica."""

    __slots__ = ("_active", "_live", "_lru", "_plan", "_runs", "_stamp", "block_size", "emit", "events",
                 "free_uncached", "n_evictable", "num_blocks", "ref", "removed_per_block", "spill", "version")

    def __init__(self, num_blocks: int, block_size: int, *, emit_events: bool = True,
                 removed_per_block: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.emit = emit_events
        # vLLM publishes one BlockRemoved per evicted block; in-process consumers may take
        # one event per eviction burst (fewer objects, same information)
        self.removed_per_block = removed_per_block
        self.free_uncached = num_blocks
        # cached block hash -> number of requests using it (> 0), or minus the stamp of the
        # request that owns it (< 0): held by that request alone, evictable once it ended
        self.ref: dict[int, int] = {}
        self.n_evictable = 0
        self._active: dict[int, Holding] = {}  # stamp -> holding of a request not released
        self._lru = EvictableRuns()  # the blocks of ended requests, and the demoted ones
        self._runs, self._live = self._lru.runs, self._lru.live  # (its dicts, read on every acquire)
        self._stamp = 0
        # match's last run found: (version, stamp, owned from, run length); see _match_run
        self._plan = (-1, 0, 0, 0)
        self.events: list[KVEvent] = []  # produced since the caller last took them
        self.version = 0  # bumped by every change, so callers can memoise queries
        # called with every run of newly stored blocks (a KV tier writes them through)
        self.spill: Callable[[list[int]], None] | None = None

    # -- queries -------------------------------------------------------------------
    def match(self, hashes: Sequence[int], limit: int) -> int:
        """How many leading blocks of ``hashes`` (at most ``limit``) are cached."""
        limit = min(limit, len(hashes))
        if limit > 0:
            hits = self._match_run(hashes, limit)
            if hits is not None:
                return hits
        return len(list(takewhile(self.ref.__contains__, islice(hashes, limit))))

    def _match_run(self, hashes: Sequence[int], limit: int) -> int | None:
        """The hit count when ``hashes`` begin with the whole block list of an ended run whose
        entries not live any more all come first (its first ``p``: blocks others hold),
        found by probing one block; then only those ``p`` are looked up, as the run's live
        entries are cached. Remembers the run for :meth:`acquire`. None when not so."""
        ref = self.ref
        c = ref.get(hashes[limit * 2 // 3])  # past the shared prefix, before the new blocks
        if c is None or c >= 0 or -c in self._active:
            return None
        stamp = -c
        run = self._runs[stamp]
        n = len(run)
        if n > limit or (hashes[:n] if type(hashes) is list else list(islice(hashes, n))) != run:
            return None
        p = n - self._live[stamp]  # the run's live entries are its last n - p if none of its first p is
        head = list(map(ref.get, islice(hashes, p)))
        if None in head or c in head:
            return None
        self._plan = (self.version, stamp, p, n)
        return n + len(list(takewhile(ref.__contains__, islice(hashes, n, limit))))

    def free_blocks(self) -> int:
        """Blocks vLLM counts as free: never used plus cached-but-unreferenced."""
        return self.free_uncached + self.n_evictable

    def usage(self) -> float:
        """vLLM's ``kv_cache_usage_perc``: the fraction of blocks in use (0..1)."""
        return 1.0 - self.free_blocks() / self.num_blocks

    def can_allocate(self, hashes: Sequence[int], hits: int, new_blocks: int) -> bool:
        """Whether ``new_blocks`` fit after referencing the first ``hits`` cached blocks."""
        avail = self.free_uncached + self.n_evictable
        if avail >= new_blocks + hits:
            return True
        ref, active = self.ref, self._active
        pinned = 0  # evictable blocks the hit would take off the free list
        for h in islice(hashes, hits):
            c = ref[h]
            if c < 0 and -c not in active:
                pinned += 1
        return avail - pinned >= new_blocks

    # -- changes -------------------------------------------------------------------
    def acquire(self, blocks: list[int]) -> Holding:
        """Reference cached ``blocks`` (a prefix-cache hit) for a new request; the returned
        holding grows as it stores blocks and is given back to :meth:`release`."""
        version, stamp, p, n = self._plan
        if version == self.version and len(blocks) >= n and blocks[:n] == self._runs[stamp]:
            return self._adopt(blocks, stamp, p, n)
        self.version += 1
        self._stamp += 1
        hold = self._active[self._stamp] = Holding(self._stamp, blocks)
        self._take(hold, blocks)
        if len(set(hold.counted)) < len(hold.counted):  # a repeated hash, counted twice (they are few)
            hold.repeated = True
        return hold

    def _adopt(self, blocks: list[int], stamp: int, p: int, n: int) -> Holding:
        """:meth:`acquire` when ``blocks[:n]`` is the ended run ``stamp`` and its entries from
        ``p`` on are live (:meth:`_match_run`): the request takes the run's stamp, which makes
        them its own as they are. Same outcome as the loop over all blocks, which would take
        the first ``p``, then those as one run, then the rest."""
        self.version += 1
        hold = self._active[stamp] = Holding(stamp, blocks)
        if p:
            self._take(hold, islice(blocks, p))
        self._unqueue(stamp, n - p, hold)  # the whole run: dropped
        if self._lru.head[0] == stamp:  # (eviction never stops in a run whose tail is live)
            self._lru.head = (0, 0)
        if len(blocks) > n:
            self._take(hold, islice(blocks, n, None))
        if len(set(hold.counted)) < len(hold.counted):
            hold.repeated = True
        return hold

    def _take(self, hold: Holding, blocks: Iterable[int]) -> None:
        """Reference ``blocks`` for ``hold``: counted if held, owned if evictable."""
        ref, active, counted = self.ref, self._active, hold.counted
        mine = -hold.stamp
        run = 0  # ``ref`` value of the evictable blocks met last (minus their run's stamp)
        n_run = 0
        for h in blocks:  # one plain loop: cheaper than several C-level passes over them
            c = ref[h]
            if c > 0:
                ref[h] = c + 1
                counted.append(h)
            elif c == run:  # evictable, in the same run as the block before (the usual)
                ref[h] = mine
                n_run += 1
            elif -c not in active:  # evictable, from another run
                if n_run:
                    self._unqueue(-run, n_run, hold)
                ref[h] = mine
                run, n_run = c, 1
            else:  # held by one request alone (this one, for a repeated hash): now counted
                owner = active[-c]
                ref[h] = 2
                owner.owned -= 1
                owner.counted.append(h)
                counted.append(h)
                hold.repeated |= owner is hold
        if n_run:
            self._unqueue(-run, n_run, hold)

    def _unqueue(self, stamp: int, n: int, hold: Holding) -> None:
        """``n`` blocks of the run ``stamp`` leave the evictable set (to the request that
        acquires them); drop the run when none is left."""
        hold.owned += n
        self.n_evictable -= n
        left = self._live[stamp] - n
        if left:
            self._live[stamp] = left
        else:
            del self._live[stamp], self._runs[stamp]

    def allocate(self, n: int) -> None:
        """Take ``n`` physical blocks, evicting least-recently-used cached blocks if needed."""
        self.version += 1
        take = min(n, self.free_uncached)
        self.free_uncached -= take
        n -= take
        if n <= 0:
            return
        removed: list[int] = []
        self._lru.evict(n, self.ref, self._active, removed)
        self.n_evictable -= len(removed)
        if self.emit:
            if self.removed_per_block:
                self.events.extend(BlockRemoved(block_hashes=[h]) for h in removed)
            else:
                self.events.append(BlockRemoved(block_hashes=removed))

    def store(
        self,
        hashes: Sequence[int],
        start: int,
        end: int,
        token_ids: Sequence[int] | None,
        hold: Holding,
        *,
        offset: int = 0,
        parent: int | None = None,
        lora: Adapter | None = None,
    ) -> int:
        """Cache blocks ``start..end-1`` of a request (now computed, with adapter ``lora``),
        held by ``hold``; return how many were newly stored. A hash already
        cached (computed concurrently by another request) stays un-hashed for this
        request, as in vLLM, and is not announced again.

        ``hashes`` may be a tail of the request's blocks (no need to concatenate lists):
        ``offset`` is the position of ``hashes[0]`` among them (for ``token_ids``) and
        ``parent`` the hash of the block before it."""
        self.version += 1
        ref = self.ref
        mine = -hold.stamp
        out = hold.blocks
        seg = hashes[start:end]
        new = dict.fromkeys(seg, mine)
        if len(new) == len(seg) and ref.keys().isdisjoint(new):
            # the common case, none cached yet (nor repeated): one run, stored in bulk
            if new:
                run = seg if type(seg) is list else list(seg)
                ref.update(new)
                out.extend(run)
                hold.owned += len(run)
                self._announce(hashes, start, run, token_ids, offset, parent, lora)
            return len(new)
        stored = 0
        run = []
        run_start = start
        for j in range(start, end):
            h = hashes[j]
            if h in ref:
                if run:
                    self._announce(hashes, run_start, run, token_ids, offset, parent, lora)
                    run = []
                run_start = j + 1
                continue
            ref[h] = mine
            out.append(h)
            run.append(h)
            stored += 1
        hold.owned += stored
        if run:
            self._announce(hashes, run_start, run, token_ids, offset, parent, lora)
        return stored

    def _announce(self, hashes: Sequence[int], first: int, run: list[int], token_ids: Sequence[int] | None,
                  offset: int, parent: int | None, lora: Adapter | None) -> None:
        if self.spill is not None:
            self.spill(run)
        if self.emit:
            self.events.append(stored_event(hashes, first, run, token_ids, offset, parent, self.block_size, lora))

    def release(self, hold: Holding, unhashed: int) -> None:
        """A request finished: drop its references (tail first) and free its un-hashed blocks."""
        self.version += 1
        self.free_uncached += unhashed
        me = hold.stamp
        self._active.pop(me, None)
        ref, mine = self.ref, -me
        if hold.repeated:
            hold.blocks = tail_first_run(ref, mine, hold.blocks)
            n = len(hold.blocks)
        else:
            n = hold.owned  # they are evictable now, as this request ended
            for h in hold.counted:
                c = ref[h] - 1
                if c:
                    ref[h] = c
                else:  # the last reference: evictable at its place in the run
                    ref[h] = mine
                    n += 1
        if n:
            self._lru.add(me, hold.blocks, n)
            self.n_evictable += n

    def discard(self, hashes: Iterable[int]) -> int:
        """Evict these cached blocks now if nobody references them (a session the control
        plane lets go); returns how many left. Blocks held or counted stay."""
        removed = self._lru.discard(hashes, self.ref, self._active)
        if removed:
            self.version += 1
            self.n_evictable -= len(removed)
            self.free_uncached += len(removed)
            if self.emit:
                self.events.append(BlockRemoved(block_hashes=removed))
        return len(removed)

    def demote(self, hashes: list[int]) -> list[int]:
        """Let these cached blocks go first when room is needed (a session the control plane
        expects not to come back), in the list's order from its end; returns the list the
        cache keeps: the caller empties it to take the demotion back (the session returned)."""
        return self._lru.demote(hashes)

    def clear_unused(self) -> bool:
        """vLLM's reset_prefix_cache: drop every cached block; refused (False) while any
        block is in use, as vLLM refuses."""
        if self.free_blocks() != self.num_blocks:
            return False
        self.reset()
        return True

    def reset(self) -> None:
        """Forget everything (an engine restart); announces AllBlocksCleared."""
        self.version += 1
        self.ref.clear()
        self._lru.clear()
        self._active.clear()
        self.n_evictable = 0
        self.free_uncached = self.num_blocks
        if self.emit:
            self.events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        ev = self.events
        self.events = []
        return ev
