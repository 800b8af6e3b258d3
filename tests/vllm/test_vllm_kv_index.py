"""The scheduler's KV index — the very code the gateway runs — fed by real vLLM's KV
events, predicts exactly the prefix-cache hits each replica then reports in its own
``vllm:prefix_cache_hits_total`` and ``usage.prompt_tokens_details.cached_tokens``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from vllm_helpers import NUM_BLOCKS, EventLog, replica_name, subscribe, unique_text, wait_for

from taskplane.engines.metrics import parse_metrics
from taskplane.engines.tokenize import tokenize
from taskplane.engines.vllm_launcher import BLOCK_SIZE, VllmReplica
from taskplane.scheduler.hashing import chain_hashes
from taskplane.scheduler.kvindex import KVIndex


def _hashes(prompt: str) -> list[int]:
    return chain_hashes(tokenize(prompt), BLOCK_SIZE)


async def _hits(client: httpx.AsyncClient, replica: VllmReplica, prompt: str) -> tuple[int, int]:
    """Send ``prompt``; return (cached_tokens the call reports, hits-counter delta)."""
    before = parse_metrics((await client.get(replica.metrics_url)).text).prefix_cache_hits
    resp = await client.post(f"{replica.url}/v1/completions",
                             json={"model": replica.model, "prompt": prompt, "max_tokens": 1})
    assert resp.status_code == 200, resp.text
    after = parse_metrics((await client.get(replica.metrics_url)).text).prefix_cache_hits
    return int(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"]), int(after - before)


@pytest_asyncio.fixture
async def fed(vllm_replicas: list[VllmReplica]) -> AsyncIterator[tuple[KVIndex, EventLog]]:
    """A KVIndex fed by both replicas' real event streams, and the events it got."""
    index = KVIndex()
    log = EventLog()
    subs = [await subscribe(r, log, then=index.apply_events) for r in vllm_replicas]
    try:
        yield index, log
    finally:
        for sub in subs:
            await sub.stop()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=120.0) as c:
        yield c


async def test_index_predicts_real_hits(
    vllm_replicas: list[VllmReplica], fed: tuple[KVIndex, EventLog], client: httpx.AsyncClient
) -> None:
    index, _ = fed
    first, second = vllm_replicas
    names = [replica_name(r) for r in vllm_replicas]
    prefix = unique_text(3 * BLOCK_SIZE + 40)
    warm, probe = prefix + unique_text(200), prefix + unique_text(200)

    assert await _hits(client, first, warm) == (0, 0)
    assert await wait_for(lambda: index.match(_hashes(warm), names) == {names[0]: 4})

    # The index says replica-0 holds the 3 shared blocks and replica-1 none; the engines agree.
    assert index.match(_hashes(probe), names) == {names[0]: 3}
    assert await _hits(client, first, probe) == (3 * BLOCK_SIZE, 3 * BLOCK_SIZE)
    assert await _hits(client, second, probe) == (0, 0)
    assert await wait_for(lambda: index.match(_hashes(probe), names) == {names[0]: 4, names[1]: 4})


async def test_block_aligned_prompt_never_hits_its_last_block(
    vllm_replicas: list[VllmReplica], fed: tuple[KVIndex, EventLog], client: httpx.AsyncClient
) -> None:
    """vLLM computes at least one prompt token, so a fully cached prompt of exactly k blocks
    hits k-1 of them: a predictor should match ``tokens[:-1]``, not ``tokens``."""
    index, _ = fed
    replica = vllm_replicas[0]
    name = replica_name(replica)
    prompt = unique_text(2 * BLOCK_SIZE)
    await _hits(client, replica, prompt)
    assert await wait_for(lambda: index.match(_hashes(prompt), [name]) == {name: 2})
    assert await _hits(client, replica, prompt) == (BLOCK_SIZE, BLOCK_SIZE)
    assert index.match(chain_hashes(tokenize(prompt)[:-1], BLOCK_SIZE), [name]) == {name: 1}


async def test_index_forgets_evicted_blocks(
    vllm_replicas: list[VllmReplica], fed: tuple[KVIndex, EventLog], client: httpx.AsyncClient
) -> None:
    index, log = fed
    replica = vllm_replicas[1]
    name = replica_name(replica)
    victim = unique_text(3 * BLOCK_SIZE + 10)
    await _hits(client, replica, victim)
    assert await wait_for(lambda: index.match(_hashes(victim), [name]) == {name: 3})
    for _ in range(NUM_BLOCKS // 20 + 2):  # more distinct blocks than the cache holds
        await _hits(client, replica, unique_text(20 * BLOCK_SIZE))
    assert await wait_for(lambda: index.match(_hashes(victim), [name]) == {})
    assert log.removed(), "eviction is announced with BlockRemoved"
    assert await _hits(client, replica, victim) == (0, 0)
