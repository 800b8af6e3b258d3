"""The approximate KV index: the gateway's own routing history.

It stands in for replicas that publish no KV events, and for any replica whose event
stream is out of sync.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from taskplane.scheduler.kv.slots import ReplicaSlots
from taskplane.scheduler.metrics import KV_BLOCKS_APPROX


class ApproxIndex:
    """The gateway's own routing history: which prompt blocks were sent where.

    Each replica keeps the most recently routed blocks up to its KV capacity, in LRU order
    (an ``OrderedDict``: O(1) per block, no eviction spikes). A prompt is recorded tail
    first so its shared beginning is the most recent and is evicted last, as vLLM does.
    """

    def __init__(self, slots: ReplicaSlots, metrics: bool = True) -> None:
        self.slots = slots
        self.metrics = metrics
        self.owners: dict[int, int] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}

    def __len__(self) -> int:
        return len(self.owners)

    def blocks_of(self, name: str) -> set[int]:
        return set(self._lru.get(name, ()))

    def size_of(self, name: str) -> int:
        """Blocks currently attributed to ``name``."""
        return len(self._lru.get(name, ()))

    def record(self, name: str, block_hashes: Sequence[int], capacity_blocks: int) -> None:
        """Remember that ``block_hashes`` were just routed to ``name``."""
        if not block_hashes:
            return
        bit = self.slots.bit(self.slots.ensure(name))
        lru = self._lru.get(name)
        if lru is None:
            lru = self._lru[name] = OrderedDict()
        owners = self.owners
        move = lru.move_to_end
        for h in reversed(block_hashes):
            if h in lru:
                move(h)
            else:
                lru[h] = None
                mask = owners.get(h, 0)
                owners[h] = mask | bit if mask else bit
        cap = max(int(capacity_blocks), 1)
        if len(lru) > cap:
            keep = ~bit
            popitem = lru.popitem
            canonical = self.slots.canonical
            for _ in range(len(lru) - cap):
                h, _none = popitem(last=False)
                mask = owners.get(h, 0) & keep
                if mask:
                    owners[h] = canonical(mask)
                else:
                    owners.pop(h, None)
        if self.metrics:
            KV_BLOCKS_APPROX.set(len(owners))

    def remove_replica(self, name: str) -> None:
        lru = self._lru.pop(name, None)
        rid = self.slots.get(name)
        if lru is None or rid is None:
            return
        keep = ~(1 << rid)
        owners = self.owners
        canonical = self.slots.canonical
        for h in lru:
            mask = owners.get(h, 0) & keep
            if mask:
                owners[h] = canonical(mask)
            else:
                owners.pop(h, None)
        if self.metrics:
            KV_BLOCKS_APPROX.set(len(owners))
