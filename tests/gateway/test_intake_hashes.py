"""Intake hashes a session's prompt reusing the session's previous prompt: the values are
still the chain of the call's own tokens, and one tenant's session never lends its
blocks to another tenant's session of the same id."""

from __future__ import annotations

import json

from taskplane.calls.intake import prepare_call
from taskplane.config import GatewayConfig
from taskplane.engines.registry import ReplicaRegistry
from taskplane.engines.tokenize import chat_tokens
from taskplane.scheduler.hashing import SessionChains, adapter_root, chain_hashes

CONFIG = GatewayConfig.model_validate({
    "auth": False, "pools": [{"model": "m", "replicas": [{"url": "http://127.0.0.1:1", "name": "r0", "block_size": 16}]}],
})


def _call(chains: SessionChains, tenant: str, messages: list[dict[str, str]]) -> list[int]:
    body = json.dumps({"model": "m", "max_tokens": 4, "messages": messages}).encode()
    headers = {"x-taskplane-tenant": tenant, "x-taskplane-session-id": "same-id"}
    call = prepare_call(CONFIG, ReplicaRegistry(CONFIG), "chat", body, headers, has_response_cache=False, chains=chains)
    assert call.request.block_hashes == chain_hashes(chat_tokens(messages)[:-1], 16)
    return call.request.block_hashes


def test_a_sessions_steps_and_another_tenants_same_session_id() -> None:
    chains = SessionChains()
    history = [{"role": "system", "content": "You triage tickets. " * 20}, {"role": "user", "content": "ticket 1"}]
    first = _call(chains, "acme", history)
    history += [{"role": "assistant", "content": "call the tool"}, {"role": "tool", "content": "result " * 30}]
    second = _call(chains, "acme", history)
    assert second[: len(first) - 1] == first[:-1] and len(second) > len(first)
    _call(chains, "globex", [{"role": "user", "content": "something else entirely " * 10}])
    assert len(chains._last) == 2  # one memo per (tenant, session)


def test_a_completion_prompt_as_token_ids_hashes_like_its_text() -> None:
    """OpenAI clients (and load generators such as ``vllm bench serve``) send completion
    prompts as token ids; the same prompt as text or as its byte-level ids lands on the
    same KV blocks."""
    text = "You triage tickets. " * 20

    def hashes(prompt: object) -> list[int]:
        body = json.dumps({"model": "m", "max_tokens": 4, "prompt": prompt}).encode()
        call = prepare_call(CONFIG, ReplicaRegistry(CONFIG), "completions", body, {}, has_response_cache=False,
                            chains=SessionChains())
        return call.request.block_hashes

    by_text = hashes(text)
    assert by_text and hashes(list(text.encode())) == by_text == hashes([list(text.encode())])
    assert hashes(list(text.encode())[::-1]) != by_text


def test_an_adapter_calls_blocks_chain_from_the_adapters_root_in_and_out_of_a_session() -> None:
    """The KV index keeps each adapter's blocks apart (vLLM hashes them apart): a call with
    adapter ``sql`` hashes from ``adapter_root("sql")``, never onto the base model's blocks,
    and a session that switches adapter does not reuse the other adapter's chain."""
    messages = [{"role": "system", "content": "You write SQL. " * 30}, {"role": "user", "content": "q1"}]
    prompt = chat_tokens(messages)[:-1]
    chains = SessionChains()

    def hashes(model: str, session: str | None) -> list[int]:
        body = json.dumps({"model": model, "max_tokens": 4, "messages": messages}).encode()
        headers = {"x-taskplane-session-id": session} if session else {}
        call = prepare_call(CONFIG, ReplicaRegistry(CONFIG), "chat", body, headers, has_response_cache=False,
                            chains=chains)
        return call.request.block_hashes

    base = chain_hashes(prompt, 16)
    for session in (None, "s1"):
        assert hashes("m", session) == base
        assert hashes("m:sql", session) == chain_hashes(prompt, 16, adapter_root("sql")) != base
        assert hashes("m:chat", session) == chain_hashes(prompt, 16, adapter_root("chat"))
