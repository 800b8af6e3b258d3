"""The precise KV index: the blocks each replica holds, from its KV events.

``BlockStored`` carries the engine's block hashes *and* the token ids; we recompute our own
chained hashes (:func:`taskplane.scheduler.hashing.chain_hashes`) from the tokens, so the
gateway can look up hashes it computes from the prompt, and keep an engine-hash -> our-hash
map per replica so a later ``BlockRemoved`` (which carries engine hashes only) can be
applied. Batches carry sequence numbers: duplicates (replays) are ignored, a gap parks later
batches until the missing ones are replayed, and ``clear_replica`` gives up and resynchronises.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from taskplane.scheduler.hashing import adapter_root, chain_hashes
from taskplane.scheduler.kv.events import (
    BlockRemoved,
    BlockStored,
    Removed,
    Stored,
    gpu_tier,
    normalize_event,
    stored_indexable,
)
from taskplane.scheduler.kv.publishers import PublisherColumns
from taskplane.scheduler.kv.slots import ReplicaSlots
from taskplane.scheduler.kv.tiers import TierIndex
from taskplane.scheduler.metrics import (
    KV_BATCHES,
    KV_BLOCKS_PRECISE,
    KV_EVENTS_CLEARED,
    KV_EVENTS_REMOVED,
    KV_EVENTS_STORED,
    KV_UNCHAINED,
)

#: How many out-of-order batches a replica may park while waiting for a replay.
MAX_PENDING_BATCHES = 4096


class BatchStatus(enum.StrEnum):
    APPLIED = "applied"  # applied (and any parked batches that now follow it)
    DUPLICATE = "duplicate"  # already applied (a replay): ignored
    GAP = "gap"  # later than expected: parked until the missing batches are replayed


@dataclass(slots=True, frozen=True)
class BatchResult:
    status: BatchStatus
    #: for GAP: the first missing sequence number (ask the publisher to replay from it)
    replay_from: int | None = None


class _PreciseReplica:
    __slots__ = ("block_size", "eng2ours", "extra", "held", "in_sync", "name", "next_seq", "pending")

    def __init__(self, name: str) -> None:
        self.name = name
        self.eng2ours: dict[Any, int] = {}
        self.extra: dict[int, int] = {}  # our hash -> extra engine hashes mapping to it
        # our hashes whose owner mask has this replica's bit: walks of one replica probe
        # this small set (cache-resident) rather than the index-wide ``owners`` dict
        self.held: set[int] = set()
        self.block_size: int | None = None
        self.next_seq: int | None = 0  # None: accept the next batch as the start
        self.pending: dict[int, list[Any]] = {}
        self.in_sync = True


class PreciseIndex:
    """Blocks each replica holds, from its KV events."""

    def __init__(self, slots: ReplicaSlots, metrics: bool = True) -> None:
        self.slots = slots
        self.metrics = metrics  # False: no Prometheus updates (each takes a lock; simulations)
        self.owners: dict[int, int] = {}
        self._replicas: dict[str, _PreciseReplica] = {}
        self.held: dict[int, set[int]] = {}  # by replica id: its ``_PreciseReplica.held``
        self.unchained_blocks = 0
        self.publishers = PublisherColumns(slots)  # by replica id: exact or not, block size
        self.tiers = TierIndex()  # host-tier blocks (events of medium CPU)

    def _set_sync(self, name: str, rep: _PreciseReplica, value: bool) -> None:
        rep.in_sync = value
        self.publishers.set_sync(self.slots.ensure(name), value)

    # -- state

    def knows(self, name: str) -> bool:
        return name in self._replicas

    def in_sync(self, name: str) -> bool:
        rep = self._replicas.get(name)
        return rep is not None and rep.in_sync

    def expected_seq(self, name: str) -> int | None:
        """The next sequence number ``apply_batch`` will apply for ``name``."""
        rep = self._replicas.get(name)
        return rep.next_seq if rep else None

    def blocks_of(self, name: str) -> set[int]:
        """Our hashes of the blocks ``name`` holds (for tests and introspection)."""
        rep = self._replicas.get(name)
        return set(rep.held) if rep else set()

    def __len__(self) -> int:
        return len(self.owners)

    def _rep(self, name: str) -> _PreciseReplica:
        rep = self._replicas.get(name)
        if rep is None:
            rep = self._replicas[name] = _PreciseReplica(name)
            self._set_sync(name, rep, True)
            self.held[self.slots.ensure(name)] = rep.held
        return rep

    def _count_batch(self, outcome: str) -> None:
        if self.metrics:
            KV_BATCHES.labels(outcome).inc()

    def _gauge(self) -> None:
        if self.metrics:
            KV_BLOCKS_PRECISE.set(len(self.owners))

    # -- batches with sequence numbers

    def apply_batch(self, name: str, seq: int, events: Iterable[Any]) -> BatchResult:
        """Apply one published batch, in sequence order.

        A publisher counts from 0, so a first batch with a later number is a gap like any
        other: replay from 0, or call ``clear_replica`` to start from what arrives.
        """
        rep = self._rep(name)
        if rep.next_seq is None:  # after clear_replica: adopt the stream where it is
            rep.next_seq = seq
        if seq < rep.next_seq or seq in rep.pending:
            self._count_batch("duplicate")
            return BatchResult(BatchStatus.DUPLICATE)
        if seq > rep.next_seq:
            if len(rep.pending) >= MAX_PENDING_BATCHES:
                # the replay is not coming: give up on the gap rather than grow without bound
                self.clear_replica(name)
                return self.apply_batch(name, seq, events)
            rep.pending[seq] = list(events)
            self._count_batch("gap")
            return BatchResult(BatchStatus.GAP, replay_from=rep.next_seq)
        self.apply_events(name, events)
        rep.next_seq = seq + 1
        while rep.next_seq in rep.pending:
            self.apply_events(name, rep.pending.pop(rep.next_seq))
            rep.next_seq += 1
        self._count_batch("applied")
        return BatchResult(BatchStatus.APPLIED)

    def clear_replica(self, name: str) -> None:
        """Forget what ``name`` holds (missed events that cannot be replayed).

        Parked batches are kept and applied from the lowest one on; the replica stays out
        of sync (matched through the approximate index as well) until the engine clears its
        cache (``AllBlocksCleared``), because blocks stored during the gap stay unknown.
        """
        rep = self._rep(name)
        self._drop_blocks(name, rep)
        self._set_sync(name, rep, False)
        if rep.pending:
            start = min(rep.pending)
            rep.next_seq = start
            while rep.next_seq in rep.pending:
                self.apply_events(name, rep.pending.pop(rep.next_seq))
                rep.next_seq += 1
            rep.pending = {s: ev for s, ev in rep.pending.items() if s > rep.next_seq}
        else:
            rep.next_seq = None
        self._gauge()

    def remove_replica(self, name: str) -> None:
        rep = self._replicas.pop(name, None)
        if rep is not None:
            self._drop_blocks(name, rep)
            rid = self.slots.get(name)
            if rid is not None:
                if self.held.get(rid) is rep.held:
                    del self.held[rid]
                self.publishers.forget(rid)
        self._gauge()

    # -- events

    def apply_events(self, name: str, events: Iterable[Any]) -> None:
        """Apply events without sequence tracking (in-process engines, tests).

        vLLM's own event structs (:mod:`taskplane.scheduler.kv.events`, what the subscriber
        decodes and the simulator emits) are read directly; any other shape goes through
        :func:`normalize_event`. Both paths apply the same rules. The event counters are
        incremented once per batch (a Prometheus ``inc`` takes a lock)."""
        rep = self._rep(name)
        bit = self.slots.bit(self.slots.ensure(name))
        n_stored = n_removed = n_cleared = 0
        try:
            for raw in events:
                kind = type(raw)
                if kind is BlockStored:
                    n_stored += 1
                    if stored_indexable(raw):
                        self._stored(rep, bit, raw.block_hashes or (), raw.parent_block_hash,
                                     raw.token_ids or (), int(raw.block_size or 0), raw.lora_name)
                    elif raw.lora_id is None and raw.lora_name is None:  # a lower tier's block
                        self.tiers.stored(self.slots.ensure(name), rep.eng2ours, raw.block_hashes or ())
                    continue
                if kind is BlockRemoved:
                    n_removed += 1
                    if gpu_tier(raw.medium):
                        self._removed(rep, bit, raw.block_hashes or ())
                    else:
                        self.tiers.removed(self.slots.ensure(name), raw.block_hashes or ())
                    continue
                ev = normalize_event(raw)
                if isinstance(ev, Stored):
                    n_stored += 1
                    if ev.indexable:
                        self._stored(rep, bit, ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size,
                                     ev.lora_name)
                    elif ev.lower_tier:  # a host-tier block (e.g. a plain dict with medium "CPU")
                        self.tiers.stored(self.slots.ensure(name), rep.eng2ours, ev.block_hashes)
                elif isinstance(ev, Removed):
                    n_removed += 1
                    if ev.indexable:
                        self._removed(rep, bit, ev.block_hashes)
                    elif ev.lower_tier:
                        self.tiers.removed(self.slots.ensure(name), ev.block_hashes)
                else:
                    n_cleared += 1
                    self._drop_blocks(name, rep)
                    self._set_sync(name, rep, True)  # the engine is empty now: its state is known
        finally:
            if self.metrics:
                if n_stored:
                    KV_EVENTS_STORED.inc(n_stored)
                if n_removed:
                    KV_EVENTS_REMOVED.inc(n_removed)
                if n_cleared:
                    KV_EVENTS_CLEARED.inc(n_cleared)
                KV_BLOCKS_PRECISE.set(len(self.owners))

    def stored_blocks(self, name: str, events: Iterable[Any]) -> list[int]:
        """Our hashes of the GPU blocks that these events, already applied, stored on
        replica ``name`` (the engine's own hashes translated; blocks not indexed are left out)."""
        rep = self._replicas.get(name)
        if rep is None:
            return []
        out: list[int] = []
        for raw in events:
            if type(raw) is BlockStored:
                hashes = raw.block_hashes if stored_indexable(raw) else ()
            else:
                ev = normalize_event(raw)
                hashes = ev.block_hashes if isinstance(ev, Stored) and ev.indexable else ()
            out.extend(ours for eng in hashes or () if (ours := rep.eng2ours.get(eng)) is not None)
        return out

    def _stored(
        self,
        rep: _PreciseReplica,
        bit: int,
        block_hashes: Sequence[Any],
        parent_block_hash: Any,
        token_ids: Sequence[int],
        bs: int,
        lora_name: str | None = None,
    ) -> None:
        """Index a ``BlockStored`` event's blocks under our own chained hashes (a chain's
        first block under its adapter's root: see :func:`adapter_root`)."""
        if bs <= 0 or not block_hashes:
            return
        if rep.block_size != bs:
            rep.block_size = bs
            self.publishers.set_block_size(self.slots.ensure(rep.name), bs)
        if parent_block_hash is None:
            parent = adapter_root(lora_name)
        else:
            known = rep.eng2ours.get(parent_block_hash)
            if known is None:
                # The parent's BlockStored was missed (or it was evicted before its child was
                # stored): without it the chain cannot be rebuilt, and a block whose parent
                # is unknown can never be part of a matched prefix anyway.
                self.unchained_blocks += len(block_hashes)
                if self.metrics:
                    KV_UNCHAINED.inc(len(block_hashes))
                return
            parent = known
        ours = chain_hashes(token_ids, bs, parent)
        owners = self.owners
        eng2ours = rep.eng2ours
        for eng, our in zip(block_hashes, ours, strict=False):
            old = eng2ours.get(eng)
            if old == our:
                continue  # replayed event: idempotent
            if old is not None:
                self._unref(rep, bit, old)
            eng2ours[eng] = our
            mask = owners.get(our, 0)
            if mask & bit:
                rep.extra[our] = rep.extra.get(our, 0) + 1
            else:
                owners[our] = mask | bit if mask else bit  # ``bit`` itself: the shared object
                rep.held.add(our)

    def _removed(self, rep: _PreciseReplica, bit: int, hashes: Iterable[Any]) -> None:
        pop = rep.eng2ours.pop
        for eng in hashes:
            our = pop(eng, None)
            if our is not None:
                self._unref(rep, bit, our)

    def _unref(self, rep: _PreciseReplica, bit: int, our: int) -> None:
        extra = rep.extra.get(our) if rep.extra else None
        if extra:
            if extra == 1:
                del rep.extra[our]
            else:
                rep.extra[our] = extra - 1
            return
        rep.held.discard(our)
        owners = self.owners
        mask = owners.pop(our, 0)
        if mask is bit:  # its only owner (the common case): one dict operation, no arithmetic
            return
        mask &= ~bit
        if mask:
            owners[our] = self.slots.canonical(mask)

    def _drop_blocks(self, name: str, rep: _PreciseReplica) -> None:
        rid = self.slots.get(name)
        if rid is None:
            return
        if self.tiers:
            self.tiers.clear(rid)
        keep = ~(1 << rid)
        owners = self.owners
        canonical = self.slots.canonical
        for our in rep.held:
            mask = owners.get(our, 0) & keep
            if mask:
                owners[our] = canonical(mask)
            else:
                owners.pop(our, None)
        rep.eng2ours.clear()
        rep.extra.clear()
        rep.held.clear()
