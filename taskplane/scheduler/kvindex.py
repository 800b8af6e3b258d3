"""Which replica holds how many leading blocks of a prompt: the KV index.

Two indexes share one replica numbering (:mod:`taskplane.scheduler.kv.slots`) and answer
one ``match`` call:

* the **precise** index (:mod:`taskplane.scheduler.kv.precise`), fed by vLLM's KV events
  per replica (:mod:`taskplane.scheduler.kv.events`);
* the **approximate** index (:mod:`taskplane.scheduler.kv.approx`), the gateway's own
  routing history, with an LRU capacity per replica estimated from its KV blocks.

Both map each block hash to a bitmask of replica ids; :mod:`taskplane.scheduler.kv.walk`
walks a prompt through them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from taskplane.scheduler.kv.approx import ApproxIndex
from taskplane.scheduler.kv.precise import BatchResult, BatchStatus, PreciseIndex
from taskplane.scheduler.kv.slots import ReplicaSlots
from taskplane.scheduler.kv.walk import extent, held_prefix, walk

__all__ = ["BatchResult", "BatchStatus", "KVIndex", "ReplicaSlots", "Source"]


class Source(enum.StrEnum):
    AUTO = "auto"  # precise for in-sync event publishers, else max(precise, approximate)
    PRECISE = "precise"
    APPROXIMATE = "approximate"


#: Up to this many replica ids, ``match_ids`` walks each id alone rather than the whole pool.
_FEW_IDS = 4

class KVIndex:
    """The precise and approximate indexes behind one ``match`` call.

    ``metrics=False`` (a scheduler built without metrics: simulations) leaves the Prometheus
    counters and gauges alone: updating them costs a lock per event batch."""

    def __init__(self, metrics: bool = True) -> None:
        self.slots = ReplicaSlots()
        self.precise = PreciseIndex(self.slots, metrics)
        self.approx = ApproxIndex(self.slots, metrics)

    # -- feeding

    def apply_batch(self, replica: str, seq: int, events: Iterable[Any]) -> BatchResult:
        return self.precise.apply_batch(replica, seq, events)

    def apply_events(self, replica: str, events: Iterable[Any]) -> None:
        self.precise.apply_events(replica, events)

    def stored_blocks(self, replica: str, events: Iterable[Any]) -> list[int]:
        """Our hashes of the GPU blocks these applied events stored (``PreciseIndex.stored_blocks``)."""
        return self.precise.stored_blocks(replica, events)

    def clear_replica(self, replica: str) -> None:
        self.precise.clear_replica(replica)

    def record_routing(self, replica: str, block_hashes: Sequence[int], capacity_blocks: int) -> None:
        self.approx.record(replica, block_hashes, capacity_blocks)

    def remove_replica(self, replica: str) -> None:
        """A replica left the pool: forget its blocks in both indexes and free its id."""
        self.precise.remove_replica(replica)
        self.approx.remove_replica(replica)
        self.slots.release(replica)

    # -- lookup

    def match_ids(
        self,
        block_hashes: Sequence[int],
        ids: np.ndarray,
        *,
        source: Source | str = Source.AUTO,
        block_size: int | None = None,
        tokenized: bool = True,
    ) -> np.ndarray:
        """Leading blocks of ``block_hashes`` held by each replica of ``ids`` (from
        ``slots.ids_of``), an int array: the hot path, no names.

        ``block_size``: the block size the hashes were computed with; replicas whose events
        use another size cannot match precisely. ``tokenized=False`` (text hashes) consults
        only the approximate index.
        """
        n = len(ids)
        if not block_hashes or n == 0:
            return np.zeros(n, dtype=np.int64)
        src = Source(source)
        if n <= _FEW_IDS:
            one = self._match_one
            return np.array([one(block_hashes, rid, src, block_size, tokenized) for rid in np.asarray(ids).tolist()],
                            dtype=np.int64)
        use_precise = tokenized and src is not Source.APPROXIMATE
        use_approx = (src is not Source.PRECISE or not tokenized) and bool(self.approx.owners)
        precise = approx = None
        if use_precise:
            precise = self._counts(self.precise.owners, block_hashes, ids, self.precise.held)
            if block_size is not None and self.precise.publishers.other_block_sizes(block_size):
                sizes = self.precise.publishers.block_size_by_id(ids)
                precise[(sizes != 0) & (sizes != block_size)] = 0
        if use_approx and self._approx_matters(block_hashes[0], src, precise is not None):
            approx = self._counts(self.approx.owners, block_hashes, ids)
        if precise is None:
            return approx if approx is not None else np.zeros(n, dtype=np.int64)
        if approx is None:
            return precise
        if src is Source.AUTO:
            # in-sync publishers are authoritative; others take the better of the two views
            authoritative = self.precise.publishers.authoritative(ids)
            return np.where(authoritative, precise, np.maximum(precise, approx))
        return np.maximum(precise, approx)

    def match_id(
        self,
        block_hashes: Sequence[int],
        rid: int,
        *,
        source: Source | str = Source.AUTO,
        block_size: int | None = None,
        tokenized: bool = True,
    ) -> int:
        """``match_ids`` for one id (a Python int), as an int: a pinned session's decision
        asks about its one replica, and a one-element id and result array cost more than
        the walk of a short prompt."""
        if not block_hashes:
            return 0
        return self._match_one(block_hashes, rid, Source(source), block_size, tokenized)

    def _approx_matters(self, first: int, src: Source, with_precise: bool) -> bool:
        """Can the approximate view change a match of a prompt starting with ``first``?

        Only replicas holding ``first`` in it can have approximate counts, and in ``AUTO``
        an in-sync publisher's precise count wins: when no such replica is out of sync
        (usually: it only records routing to replicas that are), the answer is the precise
        one and the walk, the ``np.where`` and the ``np.maximum`` are skipped."""
        holders = self.approx.owners.get(first)
        if not holders:
            return False
        return not with_precise or src is not Source.AUTO or bool(holders & ~self.precise.publishers.auth_mask)

    def _match_one(
        self, hashes: Sequence[int], rid: int, src: Source, block_size: int | None, tokenized: bool
    ) -> int:
        """One id of ``match_ids``, by the same rules (see there), walking that id alone."""
        if rid >= self.slots.capacity:
            return 0  # ``ids_of``'s slot for unknown names: holds nothing
        precise = self.precise
        matched: int | None = None
        if tokenized and src is not Source.APPROXIMATE:
            held = precise.held.get(rid)
            matched = held_prefix(held, hashes, 0) if held else 0
            if matched and block_size is not None and precise.publishers.other_block_sizes(block_size):
                size = precise.publishers.block_size_of_id(rid)
                if size and size != block_size:
                    matched = 0
        approx_owners = self.approx.owners
        if not ((src is not Source.PRECISE or not tokenized) and approx_owners):
            return matched or 0
        if matched is not None and src is Source.AUTO and precise.publishers.authoritative_id(rid):
            return matched
        approx = extent(approx_owners.get, hashes, 0, self.slots.bit(rid))
        return approx if matched is None else max(matched, approx)

    def _counts(
        self, owners: dict[int, int], hashes: Sequence[int], ids: np.ndarray, held: Mapping[int, set[int]] | None = None
    ) -> np.ndarray:
        """Leading ``hashes`` each of ``ids`` holds in ``owners``: one walk for the pool."""
        if hashes[0] not in owners:
            return np.zeros(len(ids), dtype=np.int64)
        out = np.zeros(self.slots.capacity + 1, dtype=np.int64)
        walk(owners, hashes, out, self.slots, held)
        return out[ids]

    def match(
        self,
        block_hashes: Sequence[int],
        replicas: Sequence[str],
        *,
        source: Source | str = Source.AUTO,
        block_size: int | None = None,
        tokenized: bool = True,
    ) -> dict[str, int]:
        """``{replica: leading_blocks_matched}`` for the replicas with at least one block
        (:meth:`match_ids` by name)."""
        if not block_hashes or not replicas:
            return {}
        arr = self.match_ids(block_hashes, self.slots.ids_of(replicas), source=source, block_size=block_size,
                             tokenized=tokenized)
        return {replicas[int(i)]: int(arr[i]) for i in np.flatnonzero(arr)}
