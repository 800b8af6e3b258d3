"""What the precise KV index knows of each publisher, by replica id, for vectorised matching.

Whether a replica's precise view is exact (a known publisher, in sync: its view then
replaces the approximate one) and the block size of its events, as numpy columns the
fleet-wide match indexes with ``ReplicaSlots.ids_of``, plus the exact ones as a bitmask
for the one-replica path (no numpy scalar).
"""

from __future__ import annotations

import numpy as np

from taskplane.scheduler.kv.slots import ReplicaSlots


def _grow(arr: np.ndarray, size: int) -> np.ndarray:
    if len(arr) >= size:
        return arr
    grown = np.zeros(max(size, 2 * len(arr)), dtype=arr.dtype)
    grown[: len(arr)] = arr
    return grown


class PublisherColumns:
    """By replica id: is its precise view exact, and its events' block size."""

    __slots__ = ("_auth", "_bs", "auth_mask", "block_sizes", "slots")

    def __init__(self, slots: ReplicaSlots) -> None:
        self.slots = slots
        self._auth = np.zeros(64, dtype=bool)  # by replica id: known publisher and in sync
        self.auth_mask = 0  # the same as a bitmask: lets a match skip the approximate view
        self._bs = np.zeros(64, dtype=np.int64)  # by replica id: block size of its events
        self.block_sizes: set[int] = set()  # every block size seen in events

    def set_sync(self, rid: int, value: bool) -> None:
        self._auth = _grow(self._auth, rid + 1)
        self._auth[rid] = value
        self.auth_mask = self.auth_mask | (1 << rid) if value else self.auth_mask & ~(1 << rid)

    def set_block_size(self, rid: int, block_size: int) -> None:
        self.block_sizes.add(block_size)
        self._bs = _grow(self._bs, rid + 1)
        self._bs[rid] = block_size

    def forget(self, rid: int) -> None:
        """Replica ``rid`` is gone: not exact, block size unknown."""
        if rid < len(self._auth):
            self._auth[rid] = False
        self.auth_mask &= ~(1 << rid)
        if rid < len(self._bs):
            self._bs[rid] = 0

    def authoritative(self, ids: np.ndarray) -> np.ndarray:
        """By replica id (as from ``ReplicaSlots.ids_of``): is the precise view exact?"""
        self._auth = _grow(self._auth, self.slots.capacity + 1)
        return self._auth[ids]

    def authoritative_id(self, rid: int) -> bool:
        """``authoritative`` for one id (from ``auth_mask``: no numpy scalar)."""
        return bool(self.auth_mask >> rid & 1)

    def block_size_by_id(self, ids: np.ndarray) -> np.ndarray:
        """Block size of each replica's events (0 when unknown)."""
        self._bs = _grow(self._bs, self.slots.capacity + 1)
        return self._bs[ids]

    def block_size_of_id(self, rid: int) -> int:
        """``block_size_by_id`` for one id."""
        return int(self._bs[rid]) if rid < len(self._bs) else 0

    def other_block_sizes(self, block_size: int) -> bool:
        """Have events used a block size other than ``block_size``? (Rarely: one model.)"""
        sizes = self.block_sizes
        return len(sizes) > 1 or (bool(sizes) and block_size not in sizes)
