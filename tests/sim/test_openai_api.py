"""The simulated replica answers like a vLLM OpenAI server."""

from __future__ import annotations

import json

import httpx

from taskplane.engines.metrics import parse_metrics
from taskplane.engines.tokenize import chat_tokens

from .conftest import SimProc

MSGS = [{"role": "system", "content": "You are a careful coding agent. " * 4},
        {"role": "user", "content": "Fix the failing test in parser.py, please."}]


def _chat(sim: SimProc, **kw: object) -> httpx.Response:
    body = {"model": sim.model, "messages": MSGS, "max_tokens": 24, **kw}
    return httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=30)


def test_chat_completion_shape_and_usage(sim: SimProc) -> None:
    r = _chat(sim, temperature=0)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"]) == 24  # one byte per token
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(chat_tokens(MSGS))
    assert usage["completion_tokens"] == 24
    assert usage["total_tokens"] == usage["prompt_tokens"] + 24
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    # same greedy request: same text, and now the prompt is cached (all but the last block)
    again = _chat(sim, temperature=0).json()
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]
    p = usage["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == ((p - 1) // 16) * 16


def test_streaming_chat_with_usage(sim: SimProc) -> None:
    body = {"model": sim.model, "messages": MSGS, "max_tokens": 40, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks = []
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    objs = [json.loads(c) for c in chunks[:-1]]
    assert objs[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(o["choices"][0]["delta"].get("content", "") for o in objs if o["choices"])
    assert len(text) == 40
    finals = [o for o in objs if o["choices"] and o["choices"][0]["finish_reason"]]
    assert finals and finals[-1]["choices"][0]["finish_reason"] == "length"
    usage = objs[-1]["usage"]
    assert objs[-1]["choices"] == []
    assert usage["completion_tokens"] == 40 and "cached_tokens" in usage["prompt_tokens_details"]


def test_completions_text_token_ids_and_stream(sim: SimProc) -> None:
    r = httpx.post(f"{sim.url}/v1/completions",
                   json={"model": sim.model, "prompt": "def add(a, b):", "max_tokens": 8}, timeout=30)
    assert r.status_code == 200
    b = r.json()
    assert b["object"] == "text_completion" and len(b["choices"][0]["text"]) == 8
    assert b["usage"]["prompt_tokens"] == len(b"def add(a, b):")
    r = httpx.post(f"{sim.url}/v1/completions",
                   json={"model": sim.model, "prompt": list(range(40, 90)), "max_tokens": 3}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 50
    pieces = []
    with httpx.stream("POST", f"{sim.url}/v1/completions", timeout=30,
                      json={"model": sim.model, "prompt": "x" * 20, "max_tokens": 12, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                pieces.append(json.loads(line[6:])["choices"][0]["text"])
    assert len("".join(pieces)) == 12


def test_stop_string_and_natural_length(sim: SimProc) -> None:
    first = _chat(sim, temperature=0, max_tokens=60).json()["choices"][0]["message"]["content"]
    word = first.split(" ")[1]
    stopped = _chat(sim, temperature=0, max_tokens=60, stop=[" " + word]).json()["choices"][0]
    assert stopped["finish_reason"] == "stop"
    assert stopped["message"]["content"] == first[: first.index(" " + word)]
    natural = httpx.post(f"{sim.url}/v1/chat/completions", json={"model": sim.model, "messages": MSGS},
                         timeout=30).json()
    assert natural["choices"][0]["finish_reason"] == "stop"
    assert 1 <= natural["usage"]["completion_tokens"] <= 256


def test_models_health_metrics(sim: SimProc) -> None:
    models = httpx.get(f"{sim.url}/v1/models").json()
    assert models["data"][0]["id"] == sim.model and models["data"][0]["max_model_len"] == 8192
    assert httpx.get(f"{sim.url}/health").status_code == 200
    _chat(sim)
    text = httpx.get(f"{sim.url}/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:cache_config_info"):
        assert name in text, name
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    assert "# TYPE vllm:prefix_cache_hits_total counter" in text  # prometheus_client's form, as vLLM's
    m = parse_metrics(text)
    assert m.block_size == 16 and m.num_gpu_blocks == 4096
    assert m.ttft_count == 1 and m.e2e_count == 1
    assert m.prompt_tokens == len(chat_tokens(MSGS)) and m.generation_tokens == 24
    assert m.num_running == 0 and m.models == [sim.model]


def test_bad_input_is_rejected_like_vllm(sim: SimProc) -> None:
    def post(body: object, path: str = "/v1/chat/completions") -> httpx.Response:
        return httpx.post(f"{sim.url}{path}", json=body, timeout=10)

    r = post({"model": "nope", "messages": MSGS})
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    for bad in ({"model": sim.model, "messages": []},
                {"model": sim.model, "messages": MSGS, "max_tokens": 0},
                {"model": sim.model, "messages": MSGS, "n": 99},
                {"model": sim.model, "messages": MSGS, "temperature": 5},
                {"model": sim.model, "messages": [{"role": "user", "content": "x" * 9000}]},
                {"model": sim.model, "messages": MSGS, "max_tokens": 8190}):
        r = post(bad)
        assert r.status_code == 400, bad
        err = r.json()["error"]
        assert err["type"] == "BadRequestError" and err["code"] == 400 and err["message"]
    r = httpx.post(f"{sim.url}/v1/chat/completions", content=b"{not json", timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert post({"model": sim.model, "prompt": 5}, "/v1/completions").status_code == 400
    long = post({"model": sim.model, "messages": [{"role": "user", "content": "x" * 9000}]})
    assert "maximum context length is 8192" in long.json()["error"]["message"]
