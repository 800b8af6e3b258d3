"""Small stable integer ids for replica names: the bit positions of the KV index's owner
masks, shared by the precise and approximate indexes and the session working sets."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class ReplicaSlots:
    """Stable small integer ids for replica names (bit positions in the owner masks)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._free: list[int] = []
        self._next = 0
        self.version = 0  # bumped whenever a name gains or loses its id
        self._bits: list[int] = []  # by id: the one shared ``1 << id`` object

    def get(self, name: str) -> int | None:
        return self._ids.get(name)

    def ensure(self, name: str) -> int:
        rid = self._ids.get(name)
        if rid is None:
            rid = self._free.pop() if self._free else self._next
            if rid == self._next:
                self._next += 1
            self._ids[name] = rid
            self.version += 1
        return rid

    def release(self, name: str) -> None:
        rid = self._ids.pop(name, None)
        if rid is not None:
            self._free.append(rid)
            self.version += 1

    @property
    def capacity(self) -> int:
        """One more than the highest id ever handed out."""
        return self._next

    def ids_of(self, names: Sequence[str]) -> np.ndarray:
        """Ids of ``names``; unknown names get ``capacity`` (an always-zero slot)."""
        get = self._ids.get
        cap = self._next
        return np.fromiter((get(n, cap) for n in names), dtype=np.intp, count=len(names))

    def names(self) -> list[str]:
        return list(self._ids)

    def bit(self, rid: int) -> int:
        """The shared ``1 << rid`` object, the owner mask of a block only ``rid`` holds.

        Most blocks have one owner. Storing this one object for all of them, rather than a
        fresh int per block, saves an int per index entry (about 90 bytes at 1,000 replicas)
        and lets a walk recognise a single-owner block by identity (:func:`_extent`)."""
        bits = self._bits
        while len(bits) <= rid:
            bits.append(1 << len(bits))
        return bits[rid]

    def canonical(self, mask: int) -> int:
        """``mask`` (nonzero), as the shared object of :meth:`bit` when it has one bit."""
        if mask & (mask - 1):
            return mask
        return self.bit(mask.bit_length() - 1)
