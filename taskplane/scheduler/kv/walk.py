"""Walking a prompt's chained block hashes through an owner-mask index.

Both indexes map each block hash to a bitmask of replica ids (a Python int), so a match
walks the prompt's hashes once, ANDing masks, and stops as soon as no replica is left: the
cost is one dict lookup per matched block, independent of the number of replicas or indexed
blocks. A block with a single owner (nearly all of them) stores that replica's one shared
``1 << id`` object (:meth:`ReplicaSlots.bit`): once a walk is down to one replica (or is
asked about one or a few: a pinned session) it tests each block by identity, or probes that
replica's own small, cache-resident set of blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import islice
from typing import Any

import numpy as np

from taskplane.scheduler.kv.slots import ReplicaSlots


def walk(
    owners: dict[int, int], hashes: Sequence[int], out: np.ndarray, slots: ReplicaSlots,
    held: Mapping[int, set[int]] | None = None,
) -> None:
    """Write into ``out[id]`` the number of leading ``hashes`` replica ``id`` holds.

    ``out`` must be zero where no match is found; it is only written for matching ids.
    While several replicas are alive the masks are ANDed; once one is left the rest of the
    walk is :func:`held_prefix` in its ``held`` set if given (the precise index), else
    :func:`extent` (an identity test per block, not a full-width AND).
    """
    if not hashes:
        return
    get = owners.get
    alive = get(hashes[0], 0)
    if not alive:
        return
    i = 1
    n = len(hashes)
    if alive & (alive - 1):  # several owners
        while i < n:
            cur = alive & get(hashes[i], 0)
            i += 1
            if cur != alive:
                _assign(alive & ~cur, i - 1, out)
                if not cur:
                    return
                alive = cur
                if not alive & (alive - 1):
                    break
        else:
            _assign(alive, n, out)
            return
    rid = alive.bit_length() - 1
    out[rid] = held_prefix(held[rid], hashes, i) if held is not None else extent(get, hashes, i, slots.bit(rid))


#: How many trailing blocks :func:`held_prefix` probes one by one before its bulk check.
_TAIL = 8


def held_prefix(held: set[int], hashes: Sequence[int], start: int) -> int:
    """The index of the first of ``hashes[start:]`` not in ``held`` (one replica's blocks).

    A replica's set is small enough to stay in cache where the index-wide dict is not: a
    probe costs a fraction of an ``owners`` lookup on a large index. A pinned session's
    prompt is usually held but for its last few blocks (the new turn), so the missing tail
    is found first (at most ``_TAIL`` probes from the end) and everything before it is
    checked by one ``issuperset`` (a C loop, a third of the cost per block); only a hole
    before the tail falls back to the block-by-block walk."""
    end = len(hashes)
    stop = max(start, end - _TAIL)
    while end > stop and hashes[end - 1] not in held:
        end -= 1
    if held.issuperset(islice(hashes, start, end)):
        return end  # hashes[end:] were all probed and are missing
    i = start
    for h in hashes[start:] if start else hashes:
        if h not in held:
            return i
        i += 1
    return i


def extent(get: Any, hashes: Sequence[int], start: int, bit: int) -> int:
    """The index of the first of ``hashes[start:]`` whose owner mask (``get``) lacks ``bit``.

    ``bit`` is the shared object of :meth:`ReplicaSlots.bit`, so a block only this replica
    holds passes on identity; a shared block costs one AND."""
    i = start
    for h in hashes[start:] if start else hashes:
        m = get(h)
        if m is not bit and (m is None or not m & bit):
            return i
        i += 1
    return i


def _assign(mask: int, value: int, out: np.ndarray) -> None:
    if mask.bit_count() <= 24:
        while mask:
            low = mask & -mask
            out[low.bit_length() - 1] = value
            mask ^= low
        return
    nbytes = (mask.bit_length() + 7) // 8
    bits = np.unpackbits(np.frombuffer(mask.to_bytes(nbytes, "little"), dtype=np.uint8), bitorder="little")
    out[np.flatnonzero(bits)] = value
