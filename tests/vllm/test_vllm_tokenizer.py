"""vLLM's token ids equal taskplane's tokenizer (bytes, no BOS) for completion and chat
prompts, so the gateway hashes the very blocks the replica caches."""

from __future__ import annotations

import httpx
import pytest

from taskplane.engines.tokenize import chat_tokens, tokenize
from taskplane.engines.vllm_launcher import VllmReplica

TEXTS = [
    "hello world",
    "héllo wörld — ünïcode ✓ 日本語 😀",
    "<|user|>\nnot a special token\n<|assistant|>\n",
    "  leading spaces\ttabs\r\nand newlines\n\n",
    "",
]

CHATS: list[list[dict[str, object]]] = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Fix the bug in parse() — it drops ünïcode."},
        {"role": "assistant", "content": "Which file?"},
        {"role": "user", "content": "src/parse.py 😀"},
    ],
    [
        {"role": "user", "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "part two"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
    ],
]


@pytest.mark.parametrize("text", TEXTS)
def test_completion_prompt_tokens_match(replica: VllmReplica, http: httpx.Client, text: str) -> None:
    resp = http.post(f"{replica.url}/tokenize", json={"model": replica.model, "prompt": text})
    assert resp.status_code == 200, resp.text
    assert resp.json()["tokens"] == tokenize(text)


@pytest.mark.parametrize("messages", CHATS)
def test_chat_prompt_tokens_match(replica: VllmReplica, http: httpx.Client, messages: list[dict[str, object]]) -> None:
    resp = http.post(f"{replica.url}/tokenize", json={"model": replica.model, "messages": messages})
    assert resp.status_code == 200, resp.text
    assert resp.json()["tokens"] == chat_tokens(messages)


def test_served_calls_count_and_return_taskplane_tokens(replica: VllmReplica, http: httpx.Client) -> None:
    prompt = TEXTS[1]
    resp = http.post(f"{replica.url}/v1/completions", json={
        "model": replica.model, "prompt": prompt, "max_tokens": 8, "return_token_ids": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["usage"]["prompt_tokens"] == len(tokenize(prompt))
    assert body["choices"][0]["prompt_token_ids"] == tokenize(prompt)
    assert all(0 <= t < 256 for t in body["choices"][0]["token_ids"])

    messages = CHATS[1]
    resp = http.post(f"{replica.url}/v1/chat/completions", json={
        "model": replica.model, "messages": messages, "max_tokens": 8, "return_token_ids": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["usage"]["prompt_tokens"] == len(chat_tokens(messages))
    assert body["prompt_token_ids"] == chat_tokens(messages)


def test_generation_runs_to_max_tokens(replica: VllmReplica, http: httpx.Client) -> None:
    """The EOS id lies outside the model's output vocabulary: no early stop, ever."""
    for i in range(4):
        resp = http.post(f"{replica.url}/v1/completions", json={
            "model": replica.model, "prompt": f"run {i}", "max_tokens": 96, "temperature": 1.0, "seed": i})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["usage"]["completion_tokens"] == 96
        assert body["choices"][0]["finish_reason"] == "length"
