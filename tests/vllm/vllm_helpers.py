"""Small helpers for the real-vLLM tests: prompts of exact block counts, metric snapshots,
and collecting KV events from a replica."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from taskplane.engines.kv_events import KVEventSubscriber
from taskplane.engines.metrics import MetricsSnapshot, parse_metrics
from taskplane.engines.tokenize import tokenize
from taskplane.engines.vllm_launcher import BLOCK_SIZE, VllmReplica
from taskplane.scheduler.kv.events import BlockRemoved, BlockStored, KVEvent

NUM_BLOCKS = 32
"""KV blocks per test replica: 31 usable (vLLM keeps a null block) = 3968 tokens."""
MODEL = "tiny-llama"


def unique_text(n_tokens: int) -> str:
    """A random ASCII text of exactly ``n_tokens`` tokens: every block of it is new to
    every replica, and no two of its blocks are equal."""
    text = ""
    while len(text) < n_tokens:
        text += uuid.uuid4().hex
    return text[:n_tokens]


def metrics(client: httpx.Client, replica: VllmReplica) -> MetricsSnapshot:
    resp = client.get(replica.metrics_url)
    resp.raise_for_status()
    return parse_metrics(resp.text, model=replica.model)


def complete(client: httpx.Client, replica: VllmReplica, prompt: str, max_tokens: int = 1) -> dict:
    resp = client.post(f"{replica.url}/v1/completions",
                       json={"model": replica.model, "prompt": prompt, "max_tokens": max_tokens})
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def block_chain(text: str) -> list[list[int]]:
    """The full blocks of a prompt's tokens, as vLLM caches them."""
    tokens = tokenize(text)
    full = len(tokens) // BLOCK_SIZE
    return [tokens[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE] for i in range(full)]


@dataclass
class EventLog:
    """Every KV event one subscriber received, in order."""

    events: list[KVEvent] = field(default_factory=list)

    def on_events(self, _replica: str, events: list[KVEvent]) -> None:
        self.events.extend(events)

    def stored(self) -> dict[int, list[int]]:
        """Block hash -> the block's token ids, from every BlockStored seen."""
        out: dict[int, list[int]] = {}
        for e in self.events:
            if isinstance(e, BlockStored):
                for i, h in enumerate(e.block_hashes):
                    out[h] = e.token_ids[i * e.block_size:(i + 1) * e.block_size]
        return out

    def live(self) -> set[int]:
        """Block hashes stored and not removed since, replaying the events in order."""
        held: set[int] = set()
        for e in self.events:
            if isinstance(e, BlockStored):
                held.update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                held.difference_update(e.block_hashes)
            elif type(e).__name__ == "AllBlocksCleared":
                held.clear()
        return held

    def removed(self) -> set[int]:
        return {h for e in self.events if isinstance(e, BlockRemoved) for h in e.block_hashes}

    def hashes_of(self, blocks: list[list[int]]) -> list[int]:
        """The hashes vLLM announced for these blocks (in order; a block not seen raises)."""
        by_tokens: dict[tuple[int, ...], int] = {}
        for h, toks in self.stored().items():
            by_tokens[tuple(toks)] = h
        return [by_tokens[tuple(b)] for b in blocks]


async def wait_for(pred: Callable[[], bool], timeout_s: float = 15.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if pred():
            return True
        await asyncio.sleep(0.05)
    return pred()


def replica_name(replica: VllmReplica) -> str:
    return f"replica-{replica.index}"


async def subscribe(
    replica: VllmReplica,
    log: EventLog,
    *,
    replay_from: int | None = None,
    then: Callable[[str, list[KVEvent]], None] | None = None,
) -> KVEventSubscriber:
    """A started subscriber recording into ``log`` (and passing events on to ``then``);
    waits out ZMQ's slow-joiner window before returning."""

    def on_events(name: str, events: list[KVEvent]) -> None:
        log.on_events(name, events)
        if then is not None:
            then(name, events)

    sub = KVEventSubscriber(replica_name(replica), replica.kv_events, on_events,
                            replay_endpoint=replica.replay, topic=replica.topic, replay_from=replay_from)
    await sub.start()
    await asyncio.sleep(0.5)
    return sub
