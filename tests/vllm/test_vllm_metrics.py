"""The real engine's /metrics parse with the same code as the simulator's, and the
prefix-cache counters move by exactly the shared full blocks."""

from __future__ import annotations

import httpx
from vllm_helpers import NUM_BLOCKS, complete, metrics, unique_text

from taskplane.engines.tokenize import chat_tokens, tokenize
from taskplane.engines.vllm_launcher import BLOCK_SIZE, VllmReplica


def test_metrics_parse_and_count(replica: VllmReplica, http: httpx.Client) -> None:
    before = metrics(http, replica)
    assert before.block_size == BLOCK_SIZE
    assert before.num_gpu_blocks == NUM_BLOCKS
    assert replica.model in before.models

    prompt = unique_text(300)
    body = complete(http, replica, prompt, max_tokens=5)
    after = metrics(http, replica)

    assert body["usage"]["prompt_tokens"] == 300
    assert after.prompt_tokens - before.prompt_tokens == 300
    assert after.generation_tokens - before.generation_tokens == 5
    assert after.prefix_cache_queries - before.prefix_cache_queries == 300
    assert after.ttft_count - before.ttft_count == 1
    assert after.e2e_count - before.e2e_count == 1
    assert after.num_running == 0 and after.num_waiting == 0
    assert 0.0 <= after.kv_cache_usage <= 1.0


def test_shared_prefix_hits_by_full_blocks(replica: VllmReplica, http: httpx.Client) -> None:
    shared_blocks = 3
    prefix = unique_text(shared_blocks * BLOCK_SIZE + 40)  # 3 full blocks and part of a 4th
    first, second = prefix + unique_text(200), prefix + unique_text(200)

    m0 = metrics(http, replica)
    a = complete(http, replica, first)
    m1 = metrics(http, replica)
    b = complete(http, replica, second)
    m2 = metrics(http, replica)

    assert m1.prefix_cache_hits - m0.prefix_cache_hits == 0
    assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # Only full blocks are cached and matched: the partial 4th block is recomputed.
    assert m2.prefix_cache_hits - m1.prefix_cache_hits == shared_blocks * BLOCK_SIZE
    assert m2.prefix_cache_queries - m1.prefix_cache_queries == len(tokenize(second))
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == shared_blocks * BLOCK_SIZE


def test_multi_turn_chat_hits_its_history(replica: VllmReplica, http: httpx.Client) -> None:
    """A session's next turn starts with its previous prompt: the replica hits those blocks."""
    messages: list[dict[str, str]] = [
        {"role": "system", "content": unique_text(200)},
        {"role": "user", "content": unique_text(300)},
    ]
    first = http.post(f"{replica.url}/v1/chat/completions",
                      json={"model": replica.model, "messages": messages, "max_tokens": 16})
    assert first.status_code == 200, first.text
    reply = first.json()["choices"][0]["message"]["content"]
    turn_one = chat_tokens(messages)

    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": unique_text(100)}]
    m1 = metrics(http, replica)
    second = http.post(f"{replica.url}/v1/chat/completions",
                       json={"model": replica.model, "messages": messages, "max_tokens": 16})
    m2 = metrics(http, replica)
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["prompt_tokens"] == len(chat_tokens(messages))
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= len(turn_one) // BLOCK_SIZE * BLOCK_SIZE
    assert m2.prefix_cache_hits - m1.prefix_cache_hits == cached
