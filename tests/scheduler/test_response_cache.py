"""Exact response cache: deterministic calls only, canonical keys, bounded LRU."""

from __future__ import annotations

import pytest
from _sched_util import fleet, replica

from taskplane.scheduler import ResponseCache, build_policy, cache_key
from taskplane.scheduler.hashing import text_chain_hashes
from taskplane.scheduler.types import CallRequest

MSGS = [{"role": "user", "content": "hi"}]


def test_only_deterministic_calls_have_keys() -> None:
    assert cache_key("m", {"messages": MSGS, "temperature": 0}) is not None
    assert cache_key("m", {"messages": MSGS, "temperature": 0.0, "n": 1}) is not None
    assert cache_key("m", {"messages": MSGS}) is None  # OpenAI's default temperature is 1
    assert cache_key("m", {"messages": MSGS, "temperature": 0.7}) is None
    assert cache_key("m", {"messages": MSGS, "temperature": 0, "n": 2}) is None
    assert cache_key("m", {"messages": MSGS, "temperature": 0, "logprobs": True}) is None
    assert cache_key("m", {"messages": MSGS, "temperature": "0"}) is None


def test_key_is_canonical_and_sensitive_to_what_matters() -> None:
    a = cache_key("m", {"messages": MSGS, "temperature": 0, "max_tokens": 10, "stream": True, "user": "x"})
    b = cache_key("m", {"max_tokens": 10, "temperature": 0, "messages": MSGS})  # order, stream, user ignored
    assert a == b
    assert cache_key("other", {"messages": MSGS, "temperature": 0, "max_tokens": 10}) != a
    assert cache_key("m", {"messages": MSGS, "temperature": 0, "max_tokens": 11}) != a
    assert cache_key("m", {"messages": [{"role": "user", "content": "hi!"}], "temperature": 0, "max_tokens": 10}) != a


def test_bounded_lru() -> None:
    cache = ResponseCache(2)
    k = [cache.key("m", {"messages": [{"role": "user", "content": str(i)}], "temperature": 0}) for i in range(3)]
    cache.put(k[0], {"id": 0})
    cache.put(k[1], {"id": 1})
    assert cache.get(k[0]) == {"id": 0}  # k0 is now the most recent
    cache.put(k[2], {"id": 2})
    assert cache.get(k[1]) is None and cache.get(k[0]) == {"id": 0} and len(cache) == 2
    assert cache.hits == 2 and cache.misses == 1
    off = ResponseCache(0)
    assert off.key("m", {"messages": MSGS, "temperature": 0}) is None and not off.enabled
    with pytest.raises(ValueError):
        ResponseCache(-1)


def test_scheduler_from_config_owns_a_cache() -> None:
    s = build_policy({"policy": "taskplane", "response_cache_entries": 8})
    assert s.response_cache is not None and s.response_cache.max_entries == 8
    assert build_policy("taskplane").response_cache is None


def test_text_hashes_use_the_routing_history() -> None:
    """Without a tokenizer the gateway hashes text; only the approximate index can match it."""
    s = build_policy("taskplane")
    text = "You are a helpful coding agent. " * 40
    h = text_chain_hashes(text)
    req = CallRequest(model="m", prompt_tokens=300, max_tokens=16, block_hashes=h, tokenized=False, session_id=None)
    pool = [replica("a"), replica("b"), *fleet(2)]
    first = s.decide(req, pool, 0.0)
    again = s.decide(
        CallRequest(model="m", prompt_tokens=300, max_tokens=16, block_hashes=h, tokenized=False), pool, 1.0
    )
    assert again.replica == first.replica and again.cached_blocks == len(h)
