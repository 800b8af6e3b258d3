"""KV-event publisher of the simulated replica: vLLM's ZMQ PUB + ROUTER replay protocol.

PUB frames: ``[topic, seq (8 bytes big-endian), msgpack KVEventBatch]``. The last
``buffer_steps`` batches are kept; a replay client sends ``start_seq`` (8 bytes
big-endian) to the ROUTER and receives every buffered ``(seq, payload)`` from there on,
then ``(-1, b"")``. The replay port defaults to the PUB port + 1000 (vLLM takes it from
``replay_endpoint`` in ``--kv-events-config``; the simulator has no such flag).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from collections.abc import Sequence
from typing import Any

import structlog
import zmq
import zmq.asyncio

from taskplane.engines.kv_events import END_SEQ
from taskplane.scheduler.kv.events import KVEvent, encode_batch

log = structlog.get_logger(__name__)

REPLAY_PORT_OFFSET = 1000


def default_replay_port(pub_port: int) -> int:
    return pub_port + REPLAY_PORT_OFFSET


class KVEventPublisher:
    """Publishes KV-event batches; serves replays from an asyncio task."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        replay_port: int | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        seed: int = 0,
    ) -> None:
        self.host = host
        self.port = port
        self.replay_port = default_replay_port(port) if replay_port is None else replay_port
        self.topic = topic.encode()
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.seq = 0
        self.sent = 0
        self.dropped = 0
        self._rng = random.Random(seed)
        self._ctx: Any = zmq.Context.instance()
        self._actx: Any = zmq.asyncio.Context.instance()
        self._pub: Any = None
        self._router: Any = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        bind_host = "*" if self.host in ("0.0.0.0", "") else self.host
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.set_hwm(100_000)
        self._pub.bind(f"tcp://{bind_host}:{self.port}")
        try:
            self._router = self._actx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(f"tcp://{bind_host}:{self.replay_port}")
        except zmq.ZMQError as exc:
            log.warning("kv_replay_unavailable", port=self.replay_port, error=str(exc))
            if self._router is not None:
                self._router.close(linger=0)
            self._router = None
        if self._router is not None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)

    def publish(self, ts: float, events: Sequence[KVEvent], drop_probability: float = 0.0) -> None:
        """Send one batch (or, under the drop fault, only buffer it for replay)."""
        if not events or self._pub is None:
            return
        seq = self.seq
        self.seq += 1
        payload = encode_batch(ts, events)
        self.buffer.append((seq, payload))
        if drop_probability > 0 and self._rng.random() < drop_probability:
            self.dropped += 1
            return
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
            self.sent += 1

    def restart(self) -> None:
        """A restarted engine has a new publisher: sequence from 0, empty replay buffer."""
        self.seq = 0
        self.buffer.clear()

    async def _serve_replay(self) -> None:
        assert self._router is not None
        while True:
            frames = await self._router.recv_multipart()
            if len(frames) != 3:
                log.warning("kv_replay_bad_request", frames=len(frames))
                continue
            client, _empty, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            for seq, payload in list(self.buffer):
                if seq >= start:
                    # vLLM's replay reply: [empty, topic, seq, payload], ended by [empty, empty, -1, empty]
                    await self._router.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"), payload])
            await self._router.send_multipart([client, b"", b"", END_SEQ, b""])
