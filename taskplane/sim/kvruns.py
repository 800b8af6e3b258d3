"""The evictable blocks of the simulated KV cache: runs of ended requests, oldest first.

A request's block list becomes a *run* of this lazy LRU queue when it ends, walked tail
first on eviction (vLLM frees in reverse order, so the end of a prompt goes before its shared
beginning). An entry is live iff ``ref`` (the cache's block -> reference map) still holds
minus the run's stamp: acquiring a block elsewhere leaves a stale entry, and a run with no
live entry left is dropped whole. Blocks *demoted* by the control plane (a session likely
over) are evicted before any run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Iterable
from itertools import islice


class EvictableRuns:
    """The runs of ended requests (by stamp, oldest first) and the demoted blocks."""

    __slots__ = ("demoted", "head", "live", "runs")

    def __init__(self) -> None:
        # stamp -> blocks of an ended request, oldest first, evicted from the end
        self.runs: dict[int, list[int]] = {}
        self.live: dict[int, int] = {}  # stamp -> how many of its run's entries are live
        self.head = (0, 0)  # (stamp, entries at the end of that run eviction walked past)
        # blocks the control plane expects no use of: evicted before any other when room is
        # needed; a list emptied by its owner no longer counts
        self.demoted: deque[list[int]] = deque()

    def add(self, stamp: int, blocks: list[int], live: int) -> None:
        """A request ended: ``live`` of its ``blocks`` are evictable now."""
        self.runs[stamp] = blocks
        self.live[stamp] = live

    def lose(self, stamp: int) -> None:
        """One live entry of run ``stamp`` was evicted out of order (discarded, demoted)."""
        live = self.live
        left = live[stamp] - 1
        if left:
            live[stamp] = left
        else:
            del live[stamp], self.runs[stamp]
            if self.head[0] == stamp:
                self.head = (0, 0)

    def evict(self, n: int, ref: dict[int, int], active: Container[int], removed: list[int]) -> None:
        """Evict ``n`` unreferenced blocks, demoted ones first, then the oldest runs from
        their tails, deleting them from ``ref`` and appending them to ``removed``."""
        if self.demoted:
            n = self._evict_demoted(n, ref, active, removed)
        runs, live = self.runs, self.live
        head, pos = self.head
        while n:
            stamp = next(iter(runs))  # the oldest run
            if stamp != head:  # (the run eviction stopped in was revived whole since)
                head, pos = stamp, 0
            mark, left = -stamp, live[stamp]
            for h in islice(reversed(runs[stamp]), pos, None):
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
        self.head = (head, pos)

    def _evict_demoted(self, n: int, ref: dict[int, int], active: Container[int], removed: list[int]) -> int:
        """Evict up to ``n`` demoted blocks still unreferenced, into ``removed``; returns
        how many more are needed."""
        while n and self.demoted:
            hashes = self.demoted[0]
            while hashes and n:
                h = hashes.pop()
                c = ref.get(h)
                if c is None or c > 0 or -c in active:
                    continue
                del ref[h]
                removed.append(h)
                n -= 1
                self.lose(-c)
            if not hashes:
                self.demoted.popleft()
        return n

    def discard(self, hashes: Iterable[int], ref: dict[int, int], active: Container[int]) -> list[int]:
        """Evict those of ``hashes`` that are cached and unreferenced, now; returns them."""
        removed: list[int] = []
        for h in hashes:
            c = ref.get(h)
            if c is None or c > 0 or -c in active:
                continue
            del ref[h]
            removed.append(h)
            self.lose(-c)
        return removed

    def demote(self, hashes: list[int]) -> list[int]:
        """Evict these blocks first, from the list's end; the caller empties the returned
        list to take the demotion back."""
        kept = list(hashes)
        if kept:
            self.demoted.append(kept)
        return kept

    def clear(self) -> None:
        self.runs.clear()
        self.live.clear()
        self.demoted.clear()
        self.head = (0, 0)


def tail_first_run(ref: dict[int, int], mine: int, blocks: list[int]) -> list[int]:
    """Release ``blocks`` of the request whose ``ref`` mark is ``mine`` (minus its stamp) by
    walking them tail first, as vLLM does (a hash may repeat): the run of the blocks this
    release makes evictable, in request order."""
    run = []
    for h in reversed(blocks):
        c = ref[h]
        if c == mine:
            run.append(h)
        elif c == 1:
            ref[h] = mine
            run.append(h)
        elif c > 1:
            ref[h] = c - 1
    run.reverse()
    return run
