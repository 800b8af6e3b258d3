"""The KV index's tiers below GPU memory: which blocks each replica holds in host memory.

vLLM's offloading connector announces its host (CPU) store with the same KV events as the
GPU cache, tagged ``medium="CPU"``: ``BlockStored`` with the engine's block hashes and no
token ids (the blocks were on the GPU first, so their engine hashes are already mapped to
ours by the GPU events), ``BlockRemoved`` when the host store evicts them. A match then
says how deep each tier goes: the GPU prefix (the precise index), then how far host blocks
carry it on. Scorers turn that into the prefill time a replica would save.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np


class TierIndex:
    """Host-tier blocks per replica id, under our own chained hashes."""

    __slots__ = ("eng2ours", "held")

    def __init__(self) -> None:
        self.eng2ours: dict[int, dict[Any, int]] = {}  # replica id -> engine hash -> ours
        self.held: dict[int, set[int]] = {}  # replica id -> our hashes in its host tier

    def __bool__(self) -> bool:
        return bool(self.held)

    def stored(self, rid: int, gpu_map: Mapping[Any, int], block_hashes: Iterable[Any]) -> int:
        """A ``BlockStored`` of a non-GPU medium; ``gpu_map`` is the replica's GPU engine ->
        our hash map. Blocks never seen on the GPU cannot be named and are skipped (their
        count is returned as unknown)."""
        m = self.eng2ours.setdefault(rid, {})
        held = self.held.setdefault(rid, set())
        unknown = 0
        for eng in block_hashes:
            our = gpu_map.get(eng)
            if our is None:
                our = m.get(eng)
                if our is None:
                    unknown += 1
                    continue
            m[eng] = our
            held.add(our)
        return unknown

    def removed(self, rid: int, block_hashes: Iterable[Any]) -> None:
        m = self.eng2ours.get(rid)
        if not m:
            return
        held = self.held[rid]
        for eng in block_hashes:
            our = m.pop(eng, None)
            if our is not None:
                held.discard(our)

    def clear(self, rid: int) -> None:
        self.eng2ours.pop(rid, None)
        self.held.pop(rid, None)

    def blocks_of(self, rid: int) -> set[int]:
        return set(self.held.get(rid, ()))

    def depth(self, hashes: Sequence[int], rid: int, start: int) -> int:
        """How far past ``start`` (the GPU prefix) host blocks of ``rid`` carry the prefix:
        the leading-block count of GPU and host together."""
        held = self.held.get(rid)
        n = start
        if not held:
            return n
        end = len(hashes)
        while n < end and hashes[n] in held:
            n += 1
        return n

    def depths(self, hashes: Sequence[int], ids: Iterable[int], gpu: np.ndarray) -> np.ndarray:
        """:meth:`depth` for each of ``ids`` from its GPU prefix in ``gpu`` (a float or int array)."""
        if not self.held:
            return np.asarray(gpu, dtype=np.float64)
        return np.array([self.depth(hashes, int(rid), int(g)) for rid, g in zip(ids, gpu, strict=True)],
                        dtype=np.float64)
