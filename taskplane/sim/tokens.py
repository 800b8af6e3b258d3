"""The simulator's token shape: prompts made of blocks that each repeat one content id.

A simulated request names its blocks by content ids rather than carrying real tokens; a
block of ``block_size`` copies of one id is what the engine "stores", what its
``BlockStored`` events carry, and what the KV index re-hashes. :class:`RepeatedBlocks`
keeps that shape lazy and hashes its own blocks (the scheduler's
:class:`~taskplane.scheduler.hashing.BlockContents` protocol), so neither side packs
256 ints a block.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any, overload

from taskplane.scheduler.hashing import MASK64, block_hash

_Q = struct.Struct("<q")


class _Memo:
    """A bounded map in two generations: lookups hit either, inserts go to the young one,
    and a full young generation becomes the old one (the previous old one is dropped).

    O(1) per operation with no eviction bookkeeping; an entry used within the last two
    generations survives."""

    __slots__ = ("generation", "old", "young")

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.young: dict[tuple[int, int], int] = {}
        self.old: dict[tuple[int, int], int] = {}

    def put(self, key: tuple[int, int], h: int) -> None:
        young = self.young
        if len(young) >= self.generation:
            self.old, self.young = young, {}
        self.young[key] = h


#: Per generation of the repeated-block memo (two generations: ~150 bytes an entry each).
MEMO_GENERATION = 2_000_000
_MEMOS: dict[int, _Memo] = {}  # by block size


def _memo(block_size: int) -> _Memo:
    memo = _MEMOS.get(block_size)
    if memo is None:
        memo = _MEMOS[block_size] = _Memo(MEMO_GENERATION)
    return memo


def repeated_block_hash(parent: int, token: int, block_size: int) -> int:
    """The chained hash of a block of ``block_size`` copies of ``token`` after ``parent``:
    ``chain_hashes([token] * block_size, block_size, parent)[0]``, memoised.

    The memo caches our own hash function (keyed by what it hashes), so the KV index trusts
    nothing it did not compute. Its point is the simulator, whose blocks are all one token
    repeated: the simulator names a prompt's blocks with this function and the index
    re-hashes the same blocks from ``BlockStored`` tokens (a :class:`RepeatedBlocks`, which
    hashes its own blocks through this function), so the second blake2b over 2 KB
    of tokens (~6 us at a block size of 256) becomes a dict lookup, and both sides hold the
    *same* int object, which a dict probe of the index matches by identity without reading
    the stored key (a cache miss on a large index)."""
    memo = _MEMOS.get(block_size) or _memo(block_size)
    key = (parent, token)
    h = memo.young.get(key)
    if h is None:
        h = memo.old.get(key)
        if h is None:
            h = block_hash(parent & MASK64, _Q.pack(token) * block_size)
        memo.put(key, h)
    return h


class RepeatedBlocks(Sequence[int]):
    """``n`` tokens made of blocks of ``block_size``, block ``j`` being copies of ``contents[j]``
    (the last block may be partial; ``contents`` may run past ``n``: only its first
    ``ceil(n / block_size)`` ids are read).

    The cluster simulator's tokens: its requests' blocks each carry one content id, so a
    ``BlockStored`` event's ``token_ids`` is one of these rather than a list of 256 ints per
    block that :func:`chain_hashes` would then pack and hash (together ~3.5 % of a simulated
    call's instructions). It is a :class:`~taskplane.scheduler.hashing.BlockContents`: its
    ``block_chain_hashes`` hashes it block by block with :func:`repeated_block_hash`, still
    the scheduler's own function over the same tokens. Any other reader sees the same tokens
    (indexing, iteration); a slice from a block boundary stays lazy, any other is a list."""

    __slots__ = ("block_size", "contents", "n")

    def __init__(self, contents: list[int], block_size: int, n: int) -> None:
        self.contents, self.block_size, self.n = contents, block_size, n

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...
    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(self.n)
            bs = self.block_size
            if step == 1 and not start % bs:  # every BlockStored: a run of whole blocks
                stop = max(start, stop)
                return RepeatedBlocks(self.contents[start // bs : -(-stop // bs)], bs, stop - start)
            return list(self)[i]
        n = self.n
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("token index out of range")
        return self.contents[i // self.block_size]

    def __iter__(self) -> Iterator[int]:
        left, bs = self.n, self.block_size
        for c in self.contents:
            if left <= 0:
                return
            yield from repeat(c, min(bs, left))
            left -= bs

    def block_chain_hashes(self, block_size: int, parent: int) -> list[int] | None:
        """``chain_hashes(list(self), block_size, parent)``, block by block from the memo of
        :func:`repeated_block_hash` (None for another block size than the blocks')."""
        if block_size != self.block_size:
            return None
        return _blocks_hashes(self, self.n // block_size, parent)

    def __repr__(self) -> str:
        return f"RepeatedBlocks({self.contents[: -(-self.n // self.block_size)]!r}, {self.block_size}, {self.n})"


def _blocks_hashes(tokens: RepeatedBlocks, n_full: int, h: int) -> list[int]:
    """Chained hashes of the first ``n_full`` blocks of ``tokens``, each from the memo of
    :func:`repeated_block_hash` (its young generation probed inline: this runs for every
    block of every ``BlockStored`` event the simulator emits)."""
    block_size = tokens.block_size
    memo = _MEMOS.get(block_size) or _memo(block_size)
    out: list[int] = []
    for c in tokens.contents[:n_full]:
        nxt = memo.young.get((h, c))
        h = nxt if nxt is not None else repeated_block_hash(h, c, block_size)
        out.append(h)
    return out
