"""vLLM's KV-cache events as the KV index reads them: the typed events, their msgpack
codec, and the normalisation of every other shape they may arrive in.

They live with the index (the scheduler's pure core) so that the engine side, which
subscribes to a replica's ZMQ stream (:mod:`taskplane.engines.kv_events`), and the
simulator, which emits them, both depend on the scheduler and never the reverse.

Wire format (vLLM's ``ZmqEventPublisher``): a msgpack ``KVEventBatch``, the array
``[ts, [event, ...], data_parallel_rank]``, each event a map tagged by ``"type"``
(``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``). Older vLLM releases encoded
events as arrays whose first element is the tag; some builds send the batch as a map;
block hashes are 64-bit ints by default or the raw 32-byte digest. The decoder accepts all
of these and folds a byte hash to its low 64 bits, the int vLLM would have sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

MEDIUM_GPU = "GPU"


class KVEvent(msgspec.Struct, tag=True, gc=False):
    """Base of the three event types; encoded as a map with a ``"type"`` key."""


class BlockStored(KVEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None


class BlockRemoved(KVEvent):
    block_hashes: list[int]
    medium: str | None = MEDIUM_GPU


class AllBlocksCleared(KVEvent):
    pass


@dataclass(slots=True)
class EventBatch:
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = 0


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def encode_batch(ts: float, events: Sequence[KVEvent], dp_rank: int = 0) -> bytes:
    """The msgpack payload vLLM publishes: ``[ts, [tagged maps...], dp_rank]``."""
    return _encoder.encode([ts, list(events), dp_rank])


def fold_hash(h: Any) -> int:
    """A block hash as an int: ints pass through, a byte digest keeps its low 64 bits."""
    if isinstance(h, int):
        return h
    if isinstance(h, bytes | bytearray | memoryview):
        return int.from_bytes(bytes(h)[-8:], "big")
    if isinstance(h, str):
        return int.from_bytes(h.encode()[-8:], "big")
    raise ValueError(f"unsupported block hash {h!r}")


_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def _event(raw: Any) -> KVEvent | None:
    if isinstance(raw, dict):
        kind = raw.get("type")
        fields = raw
    elif isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        kind = raw[0]
        fields = dict(zip(_FIELDS.get(kind, ()), raw[1:], strict=False))
    else:
        return None
    if kind == "BlockStored":
        parent = fields.get("parent_block_hash")
        return BlockStored(
            block_hashes=[fold_hash(h) for h in fields.get("block_hashes") or []],
            parent_block_hash=None if parent is None else fold_hash(parent),
            token_ids=list(fields.get("token_ids") or []),
            block_size=int(fields.get("block_size") or 0),
            lora_id=fields.get("lora_id"),
            medium=fields.get("medium", MEDIUM_GPU),
            lora_name=fields.get("lora_name"),
        )
    if kind == "BlockRemoved":
        return BlockRemoved(
            block_hashes=[fold_hash(h) for h in fields.get("block_hashes") or []],
            medium=fields.get("medium", MEDIUM_GPU),
        )
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None  # an event type this version does not know: skipped, not fatal


def decode_batch(payload: bytes) -> EventBatch:
    """Decode one KV-event payload from vLLM (any known variant) or the simulator.

    Unknown event types are skipped; a payload that is not a batch raises ValueError.
    """
    try:
        raw = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a msgpack KV-event batch: {exc}") from exc
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts", 0.0), raw.get("events", []), raw.get("data_parallel_rank")
    elif isinstance(raw, list | tuple) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise ValueError("not a KV-event batch: expected [ts, events, dp_rank]")
    if not isinstance(events, list):
        raise ValueError("not a KV-event batch: events is not a list")
    out = [e for e in (_event(r) for r in events) if e is not None]
    return EventBatch(ts=float(ts or 0.0), events=out, data_parallel_rank=rank)



# --------------------------------------------------------------------------- normalised


@dataclass(slots=True, frozen=True)
class Stored:
    """A normalised ``BlockStored`` event."""

    block_hashes: tuple[Any, ...]
    parent_block_hash: Any
    token_ids: tuple[int, ...] | Sequence[int]
    block_size: int
    indexable: bool = True  # False for unnamed LoRA blocks and non-GPU tiers: never matched
    lower_tier: bool = False  # a base-model block of a host / remote tier (medium not GPU)
    lora_name: str | None = None  # the adapter of the blocks (None: the base model)


@dataclass(slots=True, frozen=True)
class Removed:
    """A normalised ``BlockRemoved`` event."""

    block_hashes: tuple[Any, ...]
    indexable: bool = True
    lower_tier: bool = False  # evicted from a host / remote tier


@dataclass(slots=True, frozen=True)
class Cleared:
    """A normalised ``AllBlocksCleared`` event."""


Event = Stored | Removed | Cleared



def gpu_tier(medium: Any) -> bool:
    return medium is None or medium == "GPU" or str(medium).upper() == "GPU"


def stored_indexable(ev: Any) -> bool:
    """:func:`normalize_event`'s ``indexable`` for a :class:`BlockStored` (no group field):
    a GPU block of the base model or of an adapter the event names (a call names its
    adapter by name, so a block with only a ``lora_id`` could never be looked up)."""
    return (ev.lora_id is None or ev.lora_name is not None) and gpu_tier(ev.medium)


def normalize_event(ev: Any) -> Event:
    """Accept vLLM's KV events in any shape they reach us.

    * a mapping with a ``"type"`` key (msgpack of vLLM's tagged msgspec structs),
    * an object with those attributes (a msgspec Struct or dataclass, class name = type),
    * a list whose first item is the type tag (array-like encoding, vLLM field order),
    * an already normalised :class:`Stored` / :class:`Removed` / :class:`Cleared`.

    A LoRA adapter's GPU blocks are indexable when the event names the adapter
    (``lora_name``): the index chains them from the adapter's own root, so only that
    adapter's calls match them. Blocks of an unnamed adapter, of a non-GPU tier (``medium``
    other than GPU) or of a non-default KV cache group are kept out of the GPU index. A base-model block of a non-GPU tier is marked ``lower_tier``: the index
    records it in its tier view (what a host hit saves), as it does for the typed events.
    """
    if isinstance(ev, Stored | Removed | Cleared):
        return ev
    if isinstance(ev, Mapping):
        kind = ev.get("type")
        get = ev.get
    elif isinstance(ev, list | tuple) and ev and isinstance(ev[0], str):
        kind = ev[0]
        values = dict(zip(_FIELDS.get(kind, ()), ev[1:], strict=False))
        get = values.get
    else:
        kind = getattr(ev, "type", None) or type(ev).__name__
        def get(key: str, default: Any = None) -> Any:
            return getattr(ev, key, default)
    if kind == "BlockStored":
        lora_name = get("lora_name")
        lora = get("lora_id") is not None or lora_name is not None
        group = get("group_idx")
        gpu = gpu_tier(get("medium"))
        default_group = group is None or group == 0
        base = not lora and default_group
        return Stored(
            block_hashes=tuple(get("block_hashes") or ()),
            parent_block_hash=get("parent_block_hash"),
            token_ids=get("token_ids") or (),
            block_size=int(get("block_size") or 0),
            indexable=default_group and gpu and (not lora or lora_name is not None),
            lower_tier=base and not gpu,
            lora_name=lora_name,
        )
    if kind == "BlockRemoved":
        group = get("group_idx")
        gpu = gpu_tier(get("medium"))
        base = group is None or group == 0
        return Removed(block_hashes=tuple(get("block_hashes") or ()), indexable=base and gpu,
                       lower_tier=base and not gpu)
    if kind == "AllBlocksCleared":
        return Cleared()
    raise ValueError(f"unknown KV event type {kind!r}: expected BlockStored, BlockRemoved or AllBlocksCleared")
