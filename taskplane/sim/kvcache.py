"""A paged KV cache with chained block hashes, prefix reuse and LRU eviction, as vLLM's.

Only what placement can observe is modelled: which block hashes are cached, how many
physical blocks are free, and the events vLLM publishes when that changes. There are
no block ids: a cached block *is* its hash (vLLM keeps one cached block per hash).

Free blocks are of two kinds, as in vLLM's free queue: never-used (or un-hashed)
blocks, handed out first, and cached blocks nobody references (evictable), kept in
LRU order and evicted oldest first. A request releases its blocks tail first, so the
end of a prompt is evicted before its shared beginning (vLLM frees in reverse order
for the same reason).

Speed: a request's blocks are typically a prefix shared with other requests followed
by blocks only it holds, and these move in and out of the evictable set together (a
conversation's next turn re-acquires what its previous turn released), while few are
ever evicted. So the LRU order is kept lazily, as *runs*: a release appends the blocks
it made evictable as one run with a fresh stamp and sets their ``ref`` entry to minus
that stamp; acquiring a block sets ``ref`` back to a count, leaving a stale entry in its
run (an entry is live iff ``ref`` still holds its run's stamp), and a run none of whose
entries is live any more is dropped whole. Acquire and release update ``ref`` in bulk
(C-level dict operations, no per-block bytecode) in these common shapes.
"""

from __future__ import annotations

from collections import Counter, _count_elements  # type: ignore[attr-defined]
from collections.abc import Sequence
from itertools import islice, takewhile
from typing import Any

import numpy as np

from taskplane.engines.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


class KVCache:
    """Block accounting and prefix lookup for one replica."""

    __slots__ = ("_head", "_live", "_runs", "_stamp", "block_size", "emit", "events", "free_uncached",
                 "n_evictable", "num_blocks", "ref", "removed_per_block", "version")

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
        # cached block hash -> number of requests using it (> 0), or, when none does (the
        # block is evictable), minus the stamp of the run it was queued in (< 0)
        self.ref: dict[int, int] = {}
        self.n_evictable = 0
        self._runs: dict[int, list[int]] = {}  # stamp -> hashes, oldest first, in LRU order
        self._live: dict[int, int] = {}  # stamp -> how many of its run's entries are live
        self._head = (0, 0)  # (stamp, entries of that run eviction has walked past)
        self._stamp = 0
        self.events: list[KVEvent] = []  # produced since the caller last took them
        self.version = 0  # bumped by every change, so callers can memoise queries

    # -- queries -------------------------------------------------------------------
    def match(self, hashes: Sequence[int], limit: int) -> int:
        """How many leading blocks of ``hashes`` (at most ``limit``) are cached."""
        return len(list(takewhile(self.ref.__contains__, islice(hashes, limit))))

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
        pinned = sum(map((0).__gt__, map(self.ref.__getitem__, islice(hashes, hits))))
        return avail - pinned >= new_blocks

    # -- changes -------------------------------------------------------------------
    def acquire(self, blocks: list[int]) -> None:
        """Reference cached ``blocks`` (a prefix-cache hit)."""
        self.version += 1
        ref = self.ref
        counts = list(map(ref.__getitem__, blocks))
        k = sum(map((0).__lt__, counts))  # referenced already
        if k == len(blocks):
            _count_elements(ref, blocks)
            return
        if k == 0 or min(counts[:k]) > 0:  # referenced ones first, then evictable ones
            revive = dict.fromkeys(blocks[k:], 1)
            if len(revive) == len(blocks) - k:  # (a repeated hash would count twice)
                if k:
                    _count_elements(ref, blocks[:k])
                ref.update(revive)
                self._unqueue(counts[k:])
                return
        marks = []
        for h in blocks:
            c = ref[h]
            if c < 0:
                ref[h] = 1
                marks.append(c)
            else:
                ref[h] = c + 1
        self._unqueue(marks)

    def _unqueue(self, marks: list[int]) -> None:
        """Blocks leave the evictable set: ``marks`` are their former ``ref`` values (minus
        the stamps of their runs); a run left with no live entry is dropped."""
        self.n_evictable -= len(marks)
        if not marks:
            return
        live = self._live
        if min(marks) == max(marks):  # all from one run, the usual case
            per_run: Any = ((marks[0], len(marks)),)
        else:
            per_run = Counter(marks).items()
        for mark, n in per_run:
            left = live[-mark] - n
            if left:
                live[-mark] = left
            else:
                del live[-mark], self._runs[-mark]

    def allocate(self, n: int) -> None:
        """Take ``n`` physical blocks, evicting least-recently-used cached blocks if needed."""
        self.version += 1
        take = min(n, self.free_uncached)
        self.free_uncached -= take
        n -= take
        if n <= 0:
            return
        ref, runs, live = self.ref, self._runs, self._live
        removed: list[int] = []
        head, pos = self._head
        while n:
            stamp = next(iter(runs))  # the oldest run
            if stamp != head:  # (the run eviction stopped in was revived whole since)
                head, pos = stamp, 0
            mark, left = -stamp, live[stamp]
            for h in islice(runs[stamp], pos, None):
                pos += 1
                if ref.get(h) == mark:  # live: the oldest evictable block
                    del ref[h]
                    removed.append(h)
                    left -= 1
                    n -= 1
                    if not n or not left:
                        break
            if left:
                live[stamp] = left
            else:
                del live[stamp], runs[stamp]
        self._head = (head, pos)
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
        out: list[int],
        *,
        offset: int = 0,
        parent: int | None = None,
    ) -> int:
        """Cache blocks ``start..end-1`` of a request (now computed); append the hashes it
        now references to ``out``; return how many were newly stored. A hash already
        cached (computed concurrently by another request) stays un-hashed for this
        request, as in vLLM, and is not announced again.

        ``hashes`` may be a tail of the request's blocks (no need to concatenate lists):
        ``offset`` is the position of ``hashes[0]`` among them (for ``token_ids``) and
        ``parent`` the hash of the block before it."""
        self.version += 1
        ref = self.ref
        seg = hashes[start:end]
        new = dict.fromkeys(seg, 1)
        if len(new) == len(seg) and ref.keys().isdisjoint(new):
            # the common case, none cached yet (nor repeated): one run, stored in bulk
            if new:
                run = seg if type(seg) is list else list(seg)
                ref.update(new)
                out.extend(run)
                self._announce(hashes, start, run, token_ids, offset, parent)
            return len(new)
        stored = 0
        run = []
        run_start = start
        for j in range(start, end):
            h = hashes[j]
            if h in ref:
                if run:
                    self._announce(hashes, run_start, run, token_ids, offset, parent)
                    run = []
                run_start = j + 1
                continue
            ref[h] = 1
            out.append(h)
            run.append(h)
            stored += 1
        if run:
            self._announce(hashes, run_start, run, token_ids, offset, parent)
        return stored

    def _announce(
        self, hashes: Sequence[int], first: int, run: list[int], token_ids: Sequence[int] | None,
        offset: int, parent: int | None,
    ) -> None:
        if not self.emit:
            return
        bs = self.block_size
        toks: Any = []
        if token_ids is not None:
            a = (offset + first) * bs
            toks = token_ids[a : a + len(run) * bs]
            if not isinstance(toks, list | np.ndarray):  # a list or array slice is a copy already
                toks = list(toks)
        self.events.append(
            BlockStored(
                block_hashes=run,
                parent_block_hash=hashes[first - 1] if first > 0 else parent,
                token_ids=toks,
                block_size=bs,
            )
        )

    def release(self, held: list[int], unhashed: int) -> None:
        """A request finished: drop its references (tail first) and free its un-hashed blocks."""
        self.version += 1
        self.free_uncached += unhashed
        ref = self.ref
        self._stamp += 1
        mark = -self._stamp
        counts = list(map(ref.__getitem__, held))
        k = len(held) - counts.count(1)
        if k == len(held) or counts.index(1) == k:
            # blocks others hold too first, then blocks only this request held: those go
            # to the queue in bulk, tail first
            run = held[: k - 1 : -1] if k else held[::-1]
            ref.update(dict.fromkeys(run, mark))
            shared = held[k - 1 :: -1] if k else ()
        else:
            run, shared = [], held[::-1]
        for h in shared:
            c = ref[h] - 1
            if c:
                ref[h] = c
            else:  # its last reference (a repeated hash, or the general order)
                ref[h] = mark
                run.append(h)
        if run:
            self._runs[self._stamp] = run
            self._live[self._stamp] = len(run)
            self.n_evictable += len(run)

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
        self._runs.clear()
        self._live.clear()
        self._head, self.n_evictable = (0, 0), 0
        self.free_uncached = self.num_blocks
        if self.emit:
            self.events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        ev = self.events
        self.events = []
        return ev
