"""vLLM KV-cache events: typed events, the wire codec, and a ZMQ subscriber with replay.

Wire format, as vLLM's ``ZmqEventPublisher`` sends it (``--kv-events-config`` with
publisher ``zmq``): a PUB multipart message ``[topic, seq, payload]`` where ``seq`` is an
8-byte big-endian counter from 0 and ``payload`` a msgpack ``KVEventBatch``: the array
``[ts, [event, ...], data_parallel_rank]``, each event a map tagged by ``"type"``
(``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``). Older vLLM releases encoded
events as arrays whose first element is the tag; some builds send the batch as a map;
block hashes are 64-bit ints by default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) or
the raw 32-byte digest. The decoder accepts all of these and folds a byte hash to its
low 64 bits, the int vLLM would have sent.

Replay: a ROUTER socket beside the PUB. A client (DEALER) sends ``[b"", start_seq]``
(8-byte big-endian); real vLLM (0.32) answers with one ``[b"", topic, seq, payload]`` per
buffered batch with ``seq >= start_seq`` and ends with ``[b"", b"", -1 (8 bytes, signed),
b""]``. The subscriber also accepts the topic-less ``[b"", seq, payload]`` form.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog

log = structlog.get_logger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
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


def replay_endpoint_for(endpoint: str, offset: int = 1000) -> str:
    """The simulator's replay endpoint for a PUB endpoint: the same host, port + 1000.

    (vLLM configures its replay endpoint separately, in ``--kv-events-config``.)
    """
    host, _, port = endpoint.rpartition(":")
    return f"{host}:{int(port) + offset}"


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


OnEvents = Callable[[str, list[KVEvent]], Awaitable[None] | None]
OnResync = Callable[[str], Awaitable[None] | None]


class KVEventSubscriber:
    """Follows one replica's KV events; recovers gaps by replay, else asks for a resync.

    ``on_events(replica, events)`` receives every decoded event in sequence order.
    ``on_resync(replica)`` is called when events were lost for good (the gap is older
    than the publisher's replay buffer, there is no replay endpoint, replay timed out,
    or the publisher restarted and its sequence went backwards): the caller must forget
    what it believed about that replica. Callbacks may be plain or async functions.
    """

    def __init__(
        self,
        replica: str,
        endpoint: str,
        on_events: OnEvents,
        *,
        replay_endpoint: str | None = None,
        on_resync: OnResync | None = None,
        topic: str = "",
        replay_timeout_s: float = 2.0,
        replay_from: int | None = None,
    ) -> None:
        self.replica = replica
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.on_events = on_events
        self.on_resync = on_resync
        self.replay_timeout_s = replay_timeout_s
        # With ``replay_from`` set (usually 0), the first live batch triggers a replay of
        # everything the publisher still buffers from that sequence on: a subscriber that
        # joins late (or loses ZMQ's first messages to the slow-joiner race) catches up.
        self.last_seq: int | None = None if replay_from is None else replay_from - 1
        self.stats = {"batches": 0, "events": 0, "gaps": 0, "replayed": 0, "resyncs": 0, "decode_errors": 0}
        self._task: asyncio.Task[None] | None = None
        self._ctx: Any = None
        self._sub: Any = None
        self.connected = asyncio.Event()

    async def start(self) -> None:
        import zmq
        import zmq.asyncio

        self._ctx = zmq.asyncio.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        self._sub.connect(self.endpoint)
        self._task = asyncio.create_task(self._run(), name=f"kv-events:{self.replica}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None

    async def __aenter__(self) -> KVEventSubscriber:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _call(self, fn: Callable[..., Any] | None, *args: Any) -> None:
        if fn is None:
            return
        res = fn(*args)
        if asyncio.iscoroutine(res):
            await res

    async def _deliver(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except ValueError as exc:
            self.stats["decode_errors"] += 1
            log.warning("kv_events.decode_error", replica=self.replica, seq=seq, error=str(exc))
            self.last_seq = seq
            return
        self.last_seq = seq
        self.stats["batches"] += 1
        self.stats["events"] += len(batch.events)
        if batch.events:
            await self._call(self.on_events, self.replica, batch.events)

    async def _resync(self, reason: str) -> None:
        self.stats["resyncs"] += 1
        log.info("kv_events.resync", replica=self.replica, reason=reason)
        await self._call(self.on_resync, self.replica)

    async def _run(self) -> None:
        while True:
            frames = await self._sub.recv_multipart()
            self.connected.set()
            if len(frames) < 3:
                continue
            seq = int.from_bytes(frames[1], "big")
            payload = frames[2]
            await self._handle(seq, payload)

    async def _handle(self, seq: int, payload: bytes) -> None:
        last = self.last_seq
        if last is not None and seq <= last:
            # The publisher restarted (its counter starts again at 0): what we knew is stale.
            await self._resync(f"sequence went back from {last} to {seq}")
            self.last_seq = None
            last = None
        if last is not None and seq > last + 1:
            self.stats["gaps"] += 1
            recovered = await self._replay(last + 1, seq)
            if not recovered:
                await self._resync(f"missed {last + 1}..{seq - 1}")
        await self._deliver(seq, payload)

    async def _replay(self, start: int, until: int) -> bool:
        """Fetch batches ``start..until-1`` from the replay socket; True when all arrived."""
        if not self.replay_endpoint:
            return False
        import zmq

        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        got: dict[int, bytes] = {}
        try:
            sock.connect(self.replay_endpoint)
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.replay_timeout_s
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0 or not await sock.poll(int(remaining * 1000)):
                    log.warning("kv_events.replay_timeout", replica=self.replica, start=start)
                    return False
                frames = await sock.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) >= 3:
                    # Real vLLM puts the topic first: [topic, seq, payload], and ends with
                    # [b"", END_SEQ, b""]; keep the last two frames either way.
                    frames = frames[-2:]
                if len(frames) < 2 or frames[0] == END_SEQ:
                    break
                s = int.from_bytes(frames[0], "big")
                if start <= s < until:
                    got[s] = frames[1]
        finally:
            sock.close(linger=0)
        if set(got) != set(range(start, until)):
            return False
        for s in range(start, until):
            self.stats["replayed"] += 1
            await self._deliver(s, got[s])
        return True
