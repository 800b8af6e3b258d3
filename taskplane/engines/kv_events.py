"""vLLM KV-cache events over ZMQ: a subscriber with replay.

Wire format, as vLLM's ``ZmqEventPublisher`` sends it (``--kv-events-config`` with
publisher ``zmq``): a PUB multipart message ``[topic, seq, payload]`` where ``seq`` is an
8-byte big-endian counter from 0 and ``payload`` a msgpack ``KVEventBatch``. The event
types and the payload codec live with the KV index, in
:mod:`taskplane.scheduler.kv.events` (the engines depend on the scheduler, never the
reverse); they are re-exported here for the engine-side code that speaks the wire.

Replay: a ROUTER socket beside the PUB. A client (DEALER) sends ``[b"", start_seq]``
(8-byte big-endian); real vLLM (0.32) answers with one ``[b"", topic, seq, payload]`` per
buffered batch with ``seq >= start_seq`` and ends with ``[b"", b"", -1 (8 bytes, signed),
b""]``. The subscriber also accepts the topic-less ``[b"", seq, payload]`` form.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from taskplane.scheduler.kv.events import KVEvent, decode_batch

log = structlog.get_logger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def replay_endpoint_for(endpoint: str, offset: int = 1000) -> str:
    """The simulator's replay endpoint for a PUB endpoint: the same host, port + 1000.

    (vLLM configures its replay endpoint separately, in ``--kv-events-config``.)
    """
    host, _, port = endpoint.rpartition(":")
    return f"{host}:{int(port) + offset}"


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
