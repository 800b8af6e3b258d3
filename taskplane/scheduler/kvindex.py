"""Which replica holds how many leading blocks of a prompt: the KV index.

Two indexes share one replica numbering and answer one ``match`` call:

* the **precise** index, fed by vLLM's KV events per replica. ``BlockStored`` carries the
  engine's block hashes *and* the token ids; we recompute our own chained hashes
  (:func:`taskplane.scheduler.hashing.chain_hashes`) from the tokens, so the gateway can look
  up hashes it computes from the prompt, and keep an engine-hash -> our-hash map per replica
  so a later ``BlockRemoved`` (which carries engine hashes only) can be applied. Batches carry
  sequence numbers: duplicates (replays) are ignored, a gap parks later batches until the
  missing ones are replayed, and ``clear_replica`` gives up and resynchronises.
* the **approximate** index, the gateway's own routing history: prompt block hashes ->
  replica, with an LRU capacity per replica estimated from its KV blocks. It stands in for
  replicas that publish no events, and for any replica whose event stream is out of sync.

Both map each block hash to a bitmask of replica ids (a Python int), so ``match`` walks the
prompt's hashes once, ANDing masks, and stops as soon as no replica is left: the cost is one
dict lookup per matched block, independent of the number of replicas or indexed blocks.
A block with a single owner (nearly all of them) stores that replica's one shared ``1 << id``
object (:meth:`ReplicaSlots.bit`): no int per entry, and once a walk is down to one replica
(or is asked about one or a few: a pinned session) it tests each block by identity. The
precise index also keeps each replica's blocks as a set, and a one-replica walk probes that
small, cache-resident set instead of the index-wide dict.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge

from taskplane.engines.kv_events import BlockRemoved as _VBlockRemoved
from taskplane.engines.kv_events import BlockStored as _VBlockStored
from taskplane.scheduler.hashing import ROOT, chain_hashes

KV_EVENTS = Counter(
    "taskplane_kvindex_events_total", "KV events applied to the precise index", ["type"]
)
KV_BATCHES = Counter(
    "taskplane_kvindex_batches_total", "KV event batches by outcome", ["outcome"]
)
KV_UNCHAINED = Counter(
    "taskplane_kvindex_unchained_blocks_total",
    "stored blocks skipped because their parent block is unknown (missed events)",
)
KV_BLOCKS = Gauge("taskplane_kvindex_blocks", "distinct block hashes indexed", ["index"])
_BLOCKS_PRECISE = KV_BLOCKS.labels("precise")
_BLOCKS_APPROX = KV_BLOCKS.labels("approximate")
_EV_STORED = KV_EVENTS.labels("BlockStored")
_EV_REMOVED = KV_EVENTS.labels("BlockRemoved")
_EV_CLEARED = KV_EVENTS.labels("AllBlocksCleared")

#: How many out-of-order batches a replica may park while waiting for a replay.
MAX_PENDING_BATCHES = 4096


# --------------------------------------------------------------------------- events


@dataclass(slots=True, frozen=True)
class Stored:
    """A normalised ``BlockStored`` event."""

    block_hashes: tuple[Any, ...]
    parent_block_hash: Any
    token_ids: tuple[int, ...] | Sequence[int]
    block_size: int
    indexable: bool = True  # False for LoRA blocks and non-GPU tiers: never matched


@dataclass(slots=True, frozen=True)
class Removed:
    """A normalised ``BlockRemoved`` event."""

    block_hashes: tuple[Any, ...]
    indexable: bool = True


@dataclass(slots=True, frozen=True)
class Cleared:
    """A normalised ``AllBlocksCleared`` event."""


Event = Stored | Removed | Cleared

_STORED_ORDER = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
_REMOVED_ORDER = ("block_hashes", "medium")


def _gpu_tier(medium: Any) -> bool:
    return medium is None or medium == "GPU" or str(medium).upper() == "GPU"


def _stored_indexable(ev: Any) -> bool:
    """:func:`normalize_event`'s ``indexable`` for a ``kv_events.BlockStored`` (no group field)."""
    return ev.lora_id is None and ev.lora_name is None and _gpu_tier(ev.medium)


def normalize_event(ev: Any) -> Event:
    """Accept vLLM's KV events in any shape they reach us.

    * a mapping with a ``"type"`` key (msgpack of vLLM's tagged msgspec structs),
    * an object with those attributes (a msgspec Struct or dataclass, class name = type),
    * a list whose first item is the type tag (array-like encoding, vLLM field order),
    * an already normalised :class:`Stored` / :class:`Removed` / :class:`Cleared`.

    Blocks of a LoRA adapter, of a non-GPU tier (``medium`` other than GPU) or of a
    non-default KV cache group are kept out of the index: base-model prompts never hit them.
    """
    if isinstance(ev, Stored | Removed | Cleared):
        return ev
    if isinstance(ev, Mapping):
        kind = ev.get("type")
        get = ev.get
    elif isinstance(ev, list | tuple) and ev and isinstance(ev[0], str):
        kind = ev[0]
        order = _STORED_ORDER if kind == "BlockStored" else _REMOVED_ORDER
        values = dict(zip(order, ev[1:], strict=False))
        get = values.get
    else:
        kind = getattr(ev, "type", None) or type(ev).__name__
        def get(key: str, default: Any = None) -> Any:
            return getattr(ev, key, default)
    if kind == "BlockStored":
        lora = get("lora_id") is not None or get("lora_name") is not None
        group = get("group_idx")
        ok = not lora and _gpu_tier(get("medium")) and (group is None or group == 0)
        return Stored(
            block_hashes=tuple(get("block_hashes") or ()),
            parent_block_hash=get("parent_block_hash"),
            token_ids=get("token_ids") or (),
            block_size=int(get("block_size") or 0),
            indexable=ok,
        )
    if kind == "BlockRemoved":
        group = get("group_idx")
        ok = _gpu_tier(get("medium")) and (group is None or group == 0)
        return Removed(block_hashes=tuple(get("block_hashes") or ()), indexable=ok)
    if kind == "AllBlocksCleared":
        return Cleared()
    raise ValueError(f"unknown KV event type {kind!r}: expected BlockStored, BlockRemoved or AllBlocksCleared")


# --------------------------------------------------------------------------- replica ids


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


# --------------------------------------------------------------------------- walk


def _walk(
    owners: dict[int, int], hashes: Sequence[int], out: np.ndarray, slots: ReplicaSlots,
    held: Mapping[int, set[int]] | None = None,
) -> None:
    """Write into ``out[id]`` the number of leading ``hashes`` replica ``id`` holds.

    ``out`` must be zero where no match is found; it is only written for matching ids.
    While several replicas are alive the masks are ANDed; once one is left the rest of the
    walk is :func:`_held_prefix` in its ``held`` set if given (the precise index), else
    :func:`_extent` (an identity test per block, not a full-width AND).
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
    out[rid] = _held_prefix(held[rid], hashes, i) if held is not None else _extent(get, hashes, i, slots.bit(rid))


#: How many trailing blocks :func:`_held_prefix` probes one by one before its bulk check.
_TAIL = 8


def _held_prefix(held: set[int], hashes: Sequence[int], start: int) -> int:
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


def _extent(get: Any, hashes: Sequence[int], start: int, bit: int) -> int:
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


# --------------------------------------------------------------------------- precise


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
        self.block_sizes: set[int] = set()  # every block size seen in events
        self._auth = np.zeros(64, dtype=bool)  # by replica id: known publisher and in sync
        self.auth_mask = 0  # the same as a bitmask: lets a match skip the approximate view
        self._bs = np.zeros(64, dtype=np.int64)  # by replica id: block size of its events

    @staticmethod
    def _grow(arr: np.ndarray, size: int) -> np.ndarray:
        if len(arr) >= size:
            return arr
        grown = np.zeros(max(size, 2 * len(arr)), dtype=arr.dtype)
        grown[: len(arr)] = arr
        return grown

    def _set_sync(self, name: str, rep: _PreciseReplica, value: bool) -> None:
        rep.in_sync = value
        rid = self.slots.ensure(name)
        self._auth = self._grow(self._auth, rid + 1)
        self._auth[rid] = value
        self.auth_mask = self.auth_mask | (1 << rid) if value else self.auth_mask & ~(1 << rid)

    def authoritative(self, ids: np.ndarray) -> np.ndarray:
        """By replica id (as from ``ReplicaSlots.ids_of``): is the precise view exact?"""
        self._auth = self._grow(self._auth, self.slots.capacity + 1)
        return self._auth[ids]

    def authoritative_id(self, rid: int) -> bool:
        """``authoritative`` for one id (from ``auth_mask``: no numpy scalar)."""
        return bool(self.auth_mask >> rid & 1)

    def block_size_of_id(self, rid: int) -> int:
        """``block_size_by_id`` for one id."""
        return int(self._bs[rid]) if rid < len(self._bs) else 0

    def other_block_sizes(self, block_size: int) -> bool:
        """Have events used a block size other than ``block_size``? (Rarely: one model.)"""
        sizes = self.block_sizes
        return len(sizes) > 1 or (bool(sizes) and block_size not in sizes)

    def block_size_by_id(self, ids: np.ndarray) -> np.ndarray:
        """Block size of each replica's events (0 when unknown)."""
        self._bs = self._grow(self._bs, self.slots.capacity + 1)
        return self._bs[ids]

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

    def block_size_of(self, name: str) -> int | None:
        rep = self._replicas.get(name)
        return rep.block_size if rep else None

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
            _BLOCKS_PRECISE.set(len(self.owners))

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
            if rid is not None and self.held.get(rid) is rep.held:
                del self.held[rid]
            if rid is not None and rid < len(self._auth):
                self._auth[rid] = False
            if rid is not None:
                self.auth_mask &= ~(1 << rid)
            if rid is not None and rid < len(self._bs):
                self._bs[rid] = 0
        self._gauge()

    # -- events

    def apply_events(self, name: str, events: Iterable[Any]) -> None:
        """Apply events without sequence tracking (in-process engines, tests).

        vLLM's own event structs (:mod:`taskplane.engines.kv_events`, what the subscriber
        decodes and the simulator emits) are read directly; any other shape goes through
        :func:`normalize_event`. Both paths apply the same rules. The event counters are
        incremented once per batch (a Prometheus ``inc`` takes a lock)."""
        rep = self._rep(name)
        bit = self.slots.bit(self.slots.ensure(name))
        n_stored = n_removed = n_cleared = 0
        try:
            for raw in events:
                kind = type(raw)
                if kind is _VBlockStored:
                    n_stored += 1
                    if _stored_indexable(raw):
                        self._stored(rep, bit, raw.block_hashes or (), raw.parent_block_hash,
                                     raw.token_ids or (), int(raw.block_size or 0))
                    continue
                if kind is _VBlockRemoved:
                    n_removed += 1
                    if _gpu_tier(raw.medium):
                        self._removed(rep, bit, raw.block_hashes or ())
                    continue
                ev = normalize_event(raw)
                if isinstance(ev, Stored):
                    n_stored += 1
                    if ev.indexable:
                        self._stored(rep, bit, ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size)
                elif isinstance(ev, Removed):
                    n_removed += 1
                    if ev.indexable:
                        self._removed(rep, bit, ev.block_hashes)
                else:
                    n_cleared += 1
                    self._drop_blocks(name, rep)
                    self._set_sync(name, rep, True)  # the engine is empty now: its state is known
        finally:
            if self.metrics:
                if n_stored:
                    _EV_STORED.inc(n_stored)
                if n_removed:
                    _EV_REMOVED.inc(n_removed)
                if n_cleared:
                    _EV_CLEARED.inc(n_cleared)
                _BLOCKS_PRECISE.set(len(self.owners))

    def _stored(
        self,
        rep: _PreciseReplica,
        bit: int,
        block_hashes: Sequence[Any],
        parent_block_hash: Any,
        token_ids: Sequence[int],
        bs: int,
    ) -> None:
        """Index a ``BlockStored`` event's blocks under our own chained hashes."""
        if bs <= 0 or not block_hashes:
            return
        if rep.block_size != bs:
            rep.block_size = bs
            self.block_sizes.add(bs)
            rid = self.slots.ensure(rep.name)
            self._bs = self._grow(self._bs, rid + 1)
            self._bs[rid] = bs
        if parent_block_hash is None:
            parent = ROOT
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


# --------------------------------------------------------------------------- approximate


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
            _BLOCKS_APPROX.set(len(owners))

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
            _BLOCKS_APPROX.set(len(owners))


# --------------------------------------------------------------------------- facade


class Source(enum.StrEnum):
    AUTO = "auto"  # precise for in-sync event publishers, else max(precise, approximate)
    PRECISE = "precise"
    APPROXIMATE = "approximate"


_SOURCES: dict[str, Source] = {s.value: s for s in Source}  # Source(x) costs ~1 us per call
# The members as plain globals: ``Source.AUTO`` goes through the enum metaclass (~0.2 us);
# a normalised source is always one of these objects, so the hot paths compare by identity.
_AUTO, _PRECISE, _APPROXIMATE = Source.AUTO, Source.PRECISE, Source.APPROXIMATE

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

    def match_array(
        self,
        block_hashes: Sequence[int],
        replicas: Sequence[str],
        *,
        source: Source | str = Source.AUTO,
        block_size: int | None = None,
        tokenized: bool = True,
    ) -> np.ndarray:
        """Leading blocks of ``block_hashes`` held by each of ``replicas`` (an int array).

        ``block_size``: the block size the hashes were computed with; replicas whose events
        use another size cannot match precisely. ``tokenized=False`` (text hashes) consults
        only the approximate index.
        """
        if not block_hashes or not replicas:
            return np.zeros(len(replicas), dtype=np.int64)
        return self.match_ids(
            block_hashes, self.slots.ids_of(replicas), source=source, block_size=block_size, tokenized=tokenized
        )

    def match_ids(
        self,
        block_hashes: Sequence[int],
        ids: np.ndarray,
        *,
        source: Source | str = Source.AUTO,
        block_size: int | None = None,
        tokenized: bool = True,
    ) -> np.ndarray:
        """``match_array`` for replica ids from ``slots.ids_of`` (the hot path: no names)."""
        n = len(ids)
        if not block_hashes or n == 0:
            return np.zeros(n, dtype=np.int64)
        src = _SOURCES.get(source) or Source(source)
        if n <= _FEW_IDS:
            one = self._match_one
            return np.array([one(block_hashes, rid, src, block_size, tokenized) for rid in np.asarray(ids).tolist()],
                            dtype=np.int64)
        use_precise = tokenized and src is not _APPROXIMATE
        use_approx = (src is not _PRECISE or not tokenized) and bool(self.approx.owners)
        precise = approx = None
        if use_precise:
            precise = self._counts(self.precise.owners, block_hashes, ids, self.precise.held)
            if block_size is not None and self.precise.other_block_sizes(block_size):
                sizes = self.precise.block_size_by_id(ids)
                precise[(sizes != 0) & (sizes != block_size)] = 0
        if use_approx and self._approx_matters(block_hashes[0], src, precise is not None):
            approx = self._counts(self.approx.owners, block_hashes, ids)
        if precise is None:
            return approx if approx is not None else np.zeros(n, dtype=np.int64)
        if approx is None:
            return precise
        if src is _AUTO:
            # in-sync publishers are authoritative; others take the better of the two views
            authoritative = self.precise.authoritative(ids)
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
        return self._match_one(block_hashes, rid, _SOURCES.get(source) or Source(source), block_size, tokenized)

    def _approx_matters(self, first: int, src: Source, with_precise: bool) -> bool:
        """Can the approximate view change a match of a prompt starting with ``first``?

        Only replicas holding ``first`` in it can have approximate counts, and in ``AUTO``
        an in-sync publisher's precise count wins: when no such replica is out of sync
        (usually: it only records routing to replicas that are), the answer is the precise
        one and the walk, the ``np.where`` and the ``np.maximum`` are skipped."""
        holders = self.approx.owners.get(first)
        if not holders:
            return False
        return not with_precise or src is not _AUTO or bool(holders & ~self.precise.auth_mask)

    def _match_one(
        self, hashes: Sequence[int], rid: int, src: Source, block_size: int | None, tokenized: bool
    ) -> int:
        """One id of ``match_ids``, by the same rules (see there), walking that id alone."""
        if rid >= self.slots.capacity:
            return 0  # ``ids_of``'s slot for unknown names: holds nothing
        precise = self.precise
        matched: int | None = None
        if tokenized and src is not _APPROXIMATE:
            held = precise.held.get(rid)
            matched = _held_prefix(held, hashes, 0) if held else 0
            if matched and block_size is not None and precise.other_block_sizes(block_size):
                size = precise.block_size_of_id(rid)
                if size and size != block_size:
                    matched = 0
        approx_owners = self.approx.owners
        if not ((src is not _PRECISE or not tokenized) and approx_owners):
            return matched or 0
        if matched is not None and src is _AUTO and precise.authoritative_id(rid):
            return matched
        approx = _extent(approx_owners.get, hashes, 0, self.slots.bit(rid))
        return approx if matched is None else max(matched, approx)

    def _counts(
        self, owners: dict[int, int], hashes: Sequence[int], ids: np.ndarray, held: Mapping[int, set[int]] | None = None
    ) -> np.ndarray:
        """Leading ``hashes`` each of ``ids`` holds in ``owners``: one walk for the pool."""
        if hashes[0] not in owners:
            return np.zeros(len(ids), dtype=np.int64)
        out = np.zeros(self.slots.capacity + 1, dtype=np.int64)
        _walk(owners, hashes, out, self.slots, held)
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
        """``{replica: leading_blocks_matched}`` for the replicas with at least one block."""
        arr = self.match_array(block_hashes, replicas, source=source, block_size=block_size, tokenized=tokenized)
        return {replicas[int(i)]: int(arr[i]) for i in np.flatnonzero(arr)}
