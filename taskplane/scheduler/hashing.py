"""Chained block hashes of a token sequence, the key of every KV lookup.

The gateway hashes a prompt's tokens and the KV index hashes the tokens carried by vLLM's
``BlockStored`` events with this same function, so the two meet without trusting vLLM's own
hashes (which are seeded per process). A block's hash covers its parent's hash, so equal
hashes mean equal *prefixes*, not just equal blocks. Only full blocks are hashed: vLLM
caches only full blocks.

blake2b with an 8-byte digest is deterministic across processes and machines (unlike
Python's ``hash()``) and costs about half a microsecond per block.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any, overload

import numpy as np

#: Parent hash of a sequence's first block (a fixed constant, so every process agrees).
ROOT: int = int.from_bytes(hashlib.blake2b(b"taskplane/kv-root/v1", digest_size=8).digest(), "little")

_MASK64 = (1 << 64) - 1


_Q = struct.Struct("<q")


def _token_bytes(tokens: Sequence[int]) -> bytes:
    """Tokens as little-endian int64 bytes (packed in C: struct for lists, numpy for arrays)."""
    if isinstance(tokens, np.ndarray):
        return np.ascontiguousarray(tokens, dtype="<i8").tobytes()
    return struct.pack(f"<{len(tokens)}q", *tokens)


def _block_hash(parent: int, chunk: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(parent.to_bytes(8, "little") + chunk, digest_size=8).digest(), "little")


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
    declares that shape), so the second blake2b over 2 KB
    of tokens (~6 us at a block size of 256) becomes a dict lookup, and both sides hold the
    *same* int object, which a dict probe of the index matches by identity without reading
    the stored key (a cache miss on a large index)."""
    memo = _MEMOS.get(block_size) or _memo(block_size)
    key = (parent, token)
    h = memo.young.get(key)
    if h is None:
        h = memo.old.get(key)
        if h is None:
            h = _block_hash(parent & _MASK64, _Q.pack(token) * block_size)
        memo.put(key, h)
    return h


class RepeatedBlocks(Sequence[int]):
    """``n`` tokens made of blocks of ``block_size``, block ``j`` being copies of ``contents[j]``
    (the last block may be partial; ``contents`` may run past ``n``: only its first
    ``ceil(n / block_size)`` ids are read).

    The cluster simulator's tokens: its requests' blocks each carry one content id, so a
    ``BlockStored`` event's ``token_ids`` is one of these rather than a list of 256 ints per
    block that :func:`chain_hashes` would then inspect to recognise as repeated (together
    ~3.5 % of a simulated call's instructions). :func:`chain_hashes` hashes it block by
    block with :func:`repeated_block_hash`: still our own function over the same tokens, so
    the KV index computes every hash itself. Any other reader sees the same tokens
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


def chain_hashes(tokens: Sequence[int], block_size: int, parent: int = ROOT) -> list[int]:
    """Chained 64-bit hashes of the full blocks of ``tokens``.

    ``hashes[i]`` identifies ``tokens[: (i + 1) * block_size]`` following ``parent`` (pass the
    last hash of an earlier call to continue a chain). A trailing partial block is ignored.
    Tokens are packed in one C call and hashed block by block; the blocks of a
    :class:`RepeatedBlocks` (the simulator's tokens) of this block size come from
    :func:`repeated_block_hash` instead, the same values without the packing.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    n_full = len(tokens) // block_size
    if n_full == 0:
        return []
    h = parent & _MASK64
    if type(tokens) is RepeatedBlocks:
        if tokens.block_size == block_size:
            return _blocks_hashes(tokens, n_full, h)
        tokens = list(tokens)
    step = block_size * 8
    total = n_full * block_size
    rest = tokens if len(tokens) == total else tokens[:total]
    raw = _token_bytes(rest)
    out: list[int] = []
    for j in range(n_full):
        h = _block_hash(h, raw[j * step : (j + 1) * step])
        out.append(h)
    return out


def text_chain_hashes(text: str, chars_per_block: int = 64, parent: int = ROOT) -> list[int]:
    """Chained hashes of fixed-size character chunks, for when no tokenizer is configured.

    These live in a different hash space from token hashes, so only the approximate index
    (the gateway's own routing history) can match them; set ``CallRequest.tokenized=False``.
    """
    if chars_per_block <= 0:
        raise ValueError(f"chars_per_block must be positive, got {chars_per_block}")
    data = text.encode("utf-8")
    n_full = len(data) // chars_per_block
    blake = hashlib.blake2b
    out: list[int] = []
    h = parent & _MASK64
    for i in range(n_full):
        chunk = data[i * chars_per_block : (i + 1) * chars_per_block]
        h = int.from_bytes(blake(h.to_bytes(8, "little") + chunk, digest_size=8, person=b"tp-text").digest(), "little")
        out.append(h)
    return out
