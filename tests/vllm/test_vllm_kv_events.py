"""Real vLLM's KV-cache events decode with taskplane's codec (the same as the simulator's):
BlockStored for a prompt's full blocks, BlockRemoved when a shrunk cache evicts them, and
the replay socket hands a late subscriber what it missed."""

from __future__ import annotations

import asyncio

import httpx
import zmq
import zmq.asyncio
from vllm_helpers import NUM_BLOCKS, EventLog, block_chain, subscribe, unique_text, wait_for

from taskplane.engines.kv_events import END_SEQ
from taskplane.engines.vllm_launcher import BLOCK_SIZE, VllmReplica
from taskplane.scheduler.kv.events import BlockStored, decode_batch


async def _complete(replica: VllmReplica, prompt: str, max_tokens: int = 1) -> dict:
    async with httpx.AsyncClient(timeout=120.0) as client:
        resp = await client.post(f"{replica.url}/v1/completions",
                                 json={"model": replica.model, "prompt": prompt, "max_tokens": max_tokens})
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


async def test_block_stored_carries_the_prompt_blocks(vllm_replicas: list[VllmReplica]) -> None:
    first, second = vllm_replicas
    prompt = unique_text(2 * BLOCK_SIZE + 10)
    blocks = block_chain(prompt)
    logs = [EventLog(), EventLog()]
    subs = [await subscribe(r, log) for r, log in zip(vllm_replicas, logs, strict=True)]
    try:
        await _complete(first, prompt)
        await _complete(second, prompt)
        for log in logs:
            assert await wait_for(lambda log=log: all(tuple(b) in map(tuple, log.stored().values()) for b in blocks))
    finally:
        for sub in subs:
            await sub.stop()

    stored = [e for e in logs[0].events if isinstance(e, BlockStored) and e.token_ids[:BLOCK_SIZE] == blocks[0]]
    assert stored and stored[0].block_size == BLOCK_SIZE
    assert stored[0].parent_block_hash is None  # the first block of a sequence
    hashes = logs[0].hashes_of(blocks)
    assert len(set(hashes)) == 2
    # The same PYTHONHASHSEED on every replica: equal prefixes, equal block hashes.
    assert logs[1].hashes_of(blocks) == hashes


async def test_eviction_sends_block_removed(vllm_replicas: list[VllmReplica]) -> None:
    replica = vllm_replicas[1]
    victim = unique_text(2 * BLOCK_SIZE + 10)
    log = EventLog()
    sub = await subscribe(replica, log)
    try:
        await _complete(replica, victim)
        assert await wait_for(lambda: len(log.stored()) >= 2)
        victim_hashes = log.hashes_of(block_chain(victim))
        # Push more distinct blocks through the cache than it holds: LRU evicts everything.
        per_call = 20
        for _ in range(NUM_BLOCKS // per_call + 2):
            await _complete(replica, unique_text(per_call * BLOCK_SIZE))
        assert await wait_for(lambda: set(victim_hashes) <= log.removed())
        again = await _complete(replica, victim)
        # Evicted for real: the same prompt finds nothing cached, and is stored again
        # under the same hashes (vLLM's block hashes are deterministic).
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert await wait_for(lambda: sum(1 for e in log.events if isinstance(e, BlockStored)
                                          and victim_hashes[0] in e.block_hashes) == 2)
    finally:
        await sub.stop()


async def test_replay_socket_speaks_vllms_protocol(replica: VllmReplica) -> None:
    """Raw protocol: DEALER sends [b"", start_seq]; the replies are [b"", topic, seq, payload]
    and end with [b"", b"", -1, b""]."""
    prompt = unique_text(BLOCK_SIZE + 5)
    await _complete(replica, prompt)
    ctx = zmq.asyncio.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(replica.replay)
    seqs: list[int] = []
    tokens: list[list[int]] = []
    try:
        await sock.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            assert await sock.poll(10_000), "replay socket did not answer"
            frames = await sock.recv_multipart()
            assert frames[0] == b""
            if frames[2] == END_SEQ:
                assert frames[1] == b"" and frames[3] == b""
                break
            _, topic, seq, payload = frames
            assert topic == replica.topic.encode()
            seqs.append(int.from_bytes(seq, "big"))
            tokens += [e.token_ids for e in decode_batch(payload).events if isinstance(e, BlockStored)]
    finally:
        sock.close(linger=0)
    assert seqs and seqs[0] == 0 and seqs == sorted(seqs)
    assert any(t[:BLOCK_SIZE] == block_chain(prompt)[0] for t in tokens)


async def test_late_subscriber_catches_up_by_replay(replica: VllmReplica) -> None:
    early = unique_text(BLOCK_SIZE + 5)
    await _complete(replica, early)  # published before anyone below listens
    log = EventLog()
    sub = await subscribe(replica, log, replay_from=0)
    try:
        late = unique_text(BLOCK_SIZE + 5)
        await _complete(replica, late)  # the first live batch triggers the replay from 0
        want = [tuple(block_chain(early)[0]), tuple(block_chain(late)[0])]
        assert await wait_for(lambda: all(w in map(tuple, log.stored().values()) for w in want))
        assert sub.stats["replayed"] > 0
        assert sub.stats["resyncs"] == 0
    finally:
        await sub.stop()


async def test_events_keep_flowing_under_concurrency(replica: VllmReplica) -> None:
    """Several calls in one engine step: every full block is announced exactly once."""
    prompts = [unique_text(BLOCK_SIZE * 2 + 3) for _ in range(4)]
    log = EventLog()
    sub = await subscribe(replica, log)
    try:
        await asyncio.gather(*(_complete(replica, p) for p in prompts))
        want = {tuple(b) for p in prompts for b in block_chain(p)}
        assert await wait_for(lambda: want <= set(map(tuple, log.stored().values())))
    finally:
        await sub.stop()
    assert sub.stats["gaps"] == 0 and sub.stats["decode_errors"] == 0
