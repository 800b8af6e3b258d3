"""A paged KV cache with chained block hashes, prefix reuse and LRU eviction, as vLLM's.

Only what placement can observe is modelled: which block hashes are cached, how many
physical blocks are free, and the events vLLM publishes when that changes. There are
no block ids: a cached block *is* its hash (vLLM keeps one cached block per hash).

Free blocks are of two kinds, as in vLLM's free queue: never-used (or un-hashed)
blocks, handed out first, and cached blocks nobody references (``evictable``), kept in
LRU order and evicted oldest first. A request releases its blocks tail first, so the
end of a prompt is evicted before its shared beginning (vLLM frees in reverse order
for the same reason).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice, takewhile
from typing import Any

import numpy as np

from taskplane.engines.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


class KVCache:
    """Block accounting and prefix lookup for one replica."""

    __slots__ = ("block_size", "emit", "events", "evictable", "free_uncached", "num_blocks", "ref",
                 "removed_per_block", "version")

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
        self.ref: dict[int, int] = {}  # cached block hash -> number of requests using it
        self.evictable: OrderedDict[int, None] = OrderedDict()  # ref == 0, oldest first
        self.events: list[KVEvent] = []  # produced since the caller last took them
        self.version = 0  # bumped by every change, so callers can memoise queries

    # -- queries -------------------------------------------------------------------
    def match(self, hashes: Sequence[int], limit: int) -> int:
        """How many leading blocks of ``hashes`` (at most ``limit``) are cached."""
        return len(list(takewhile(self.ref.__contains__, islice(hashes, limit))))

    def free_blocks(self) -> int:
        """Blocks vLLM counts as free: never used plus cached-but-unreferenced."""
        return self.free_uncached + len(self.evictable)

    def usage(self) -> float:
        """vLLM's ``kv_cache_usage_perc``: the fraction of blocks in use (0..1)."""
        return 1.0 - self.free_blocks() / self.num_blocks

    def can_allocate(self, hashes: Sequence[int], hits: int, new_blocks: int) -> bool:
        """Whether ``new_blocks`` fit after referencing the first ``hits`` cached blocks."""
        avail = self.free_uncached + len(self.evictable)
        if avail >= new_blocks + hits:
            return True
        ref = self.ref
        pinned = 0
        for i in range(hits):
            if ref[hashes[i]] == 0:
                pinned += 1
        return avail - pinned >= new_blocks

    # -- changes -------------------------------------------------------------------
    def acquire(self, hashes: Sequence[int], hits: int) -> None:
        """Reference the first ``hits`` cached blocks (a prefix-cache hit)."""
        self.version += 1
        ref, ev = self.ref, self.evictable
        for i in range(hits):
            h = hashes[i]
            c = ref[h]
            if c == 0:
                del ev[h]
            ref[h] = c + 1

    def allocate(self, n: int) -> None:
        """Take ``n`` physical blocks, evicting least-recently-used cached blocks if needed."""
        self.version += 1
        take = min(n, self.free_uncached)
        self.free_uncached -= take
        n -= take
        if n <= 0:
            return
        ev, ref = self.evictable, self.ref
        removed: list[int] = []
        for _ in range(n):
            h, _none = ev.popitem(last=False)
            del ref[h]
            removed.append(h)
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

    def release(self, held: Sequence[int], unhashed: int) -> None:
        """A request finished: drop its references (tail first) and free its un-hashed blocks."""
        self.version += 1
        ref, ev = self.ref, self.evictable
        for h in reversed(held):
            c = ref[h] - 1
            ref[h] = c
            if c == 0:
                ev[h] = None
        self.free_uncached += unhashed

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
        self.evictable.clear()
        self.free_uncached = self.num_blocks
        if self.emit:
            self.events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        ev = self.events
        self.events = []
        return ev
