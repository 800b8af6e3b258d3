"""The simulated replica honours tools, tool_choice, response_format, logprobs and n as
vLLM does (guided decoding: whatever the weights, the output parses and fits the schema),
and serves /v1/responses and /v1/embeddings."""

from __future__ import annotations

import json
import math

import httpx
import jsonschema

from .conftest import SimProc

MSGS = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "minLength": 2},
                                     "unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit", "days"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}}
ANSWER = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40}, "score": {"type": "number", "minimum": 0, "maximum": 1},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4},
    "verdict": {"anyOf": [{"$ref": "#/$defs/Verdict"}, {"type": "null"}]}},
    "required": ["title", "score", "tags", "verdict"], "$defs": {"Verdict": {"type": "object", "properties": {
        "ok": {"type": "boolean"}, "when": {"type": "string", "format": "date-time"}}, "required": ["ok", "when"]}}}


def _chat(sim: SimProc, **kw: object) -> httpx.Response:
    return httpx.post(f"{sim.url}/v1/chat/completions",
                      json={"model": sim.model, "messages": MSGS, "max_tokens": 400, **kw}, timeout=30)


def test_required_and_named_tool_calls_are_schema_valid_and_seeded(sim: SimProc) -> None:
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = _chat(sim, tools=[WEATHER, CLOCK], tool_choice=choice, seed=7)
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        assert ch["finish_reason"] == "tool_calls" and ch["message"]["content"] is None
        calls = ch["message"]["tool_calls"]
        assert calls and all(c["type"] == "function" and c["id"] for c in calls)
        for c in calls:
            args = json.loads(c["function"]["arguments"])
            if c["function"]["name"] == "get_weather":
                jsonschema.validate(args, WEATHER["function"]["parameters"])
            else:
                assert c["function"]["name"] == "clock"
        if isinstance(choice, dict):
            assert [c["function"]["name"] for c in calls] == ["get_weather"]
        again = _chat(sim, tools=[WEATHER, CLOCK], tool_choice=choice, seed=7).json()["choices"][0]
        assert again["message"]["tool_calls"] == calls  # same seed and prompt: same calls


def test_auto_answers_in_text_after_a_tool_result_and_none_never_calls(sim: SimProc) -> None:
    first = _chat(sim, tools=[WEATHER], seed=1).json()["choices"][0]
    assert first["finish_reason"] == "tool_calls"
    call = first["message"]["tool_calls"][0]
    follow = [*MSGS, first["message"], {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    r = httpx.post(f"{sim.url}/v1/chat/completions", timeout=30,
                   json={"model": sim.model, "messages": follow, "tools": [WEATHER], "max_tokens": 16})
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "length" and ch["message"]["content"] and not ch["message"]["tool_calls"]
    assert not _chat(sim, tools=[WEATHER], tool_choice="none").json()["choices"][0]["message"]["tool_calls"]


def test_bad_tool_choice_is_a_400(sim: SimProc) -> None:
    r = _chat(sim, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
    assert r.status_code == 400 and "nope" in r.json()["error"]["message"]


def test_json_schema_and_json_object(sim: SimProc) -> None:
    cut = _chat(sim, response_format={"type": "json_object"}, max_tokens=3).json()["choices"][0]
    assert cut["finish_reason"] == "length" and len(cut["message"]["content"]) == 3  # vLLM cuts at max_tokens too
    for seed in range(5):
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
        content = _chat(sim, response_format=fmt, seed=seed).json()["choices"][0]["message"]["content"]
        jsonschema.validate(json.loads(content), ANSWER)
    obj = json.loads(_chat(sim, response_format={"type": "json_object"}).json()["choices"][0]["message"]["content"])
    assert isinstance(obj, dict) and obj


def test_logprobs_and_n(sim: SimProc) -> None:
    body = _chat(sim, logprobs=True, top_logprobs=3, n=3, max_tokens=12, temperature=0.7, seed=3).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    texts = [c["message"]["content"] for c in body["choices"]]
    assert len(set(texts)) > 1 and body["usage"]["completion_tokens"] == 36
    for c in body["choices"]:
        content = c["logprobs"]["content"]
        assert "".join(t["token"] for t in content) == c["message"]["content"]
        assert all(t["logprob"] <= 0 and len(t["top_logprobs"]) == 3 for t in content)
    comp = httpx.post(f"{sim.url}/v1/completions", timeout=30,
                      json={"model": sim.model, "prompt": "hello", "max_tokens": 5, "logprobs": 2}).json()
    lp = comp["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == comp["choices"][0]["text"] and len(lp["top_logprobs"][0]) == 2


def test_responses_api_with_tools_and_text_format(sim: SimProc) -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    r = httpx.post(f"{sim.url}/v1/responses", timeout=30, json={
        "model": sim.model, "input": "weather?", "instructions": "be brief", "tools": [tool],
        "tool_choice": "required"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response" and body["status"] == "completed"
    fc = body["output"][0]
    assert fc["type"] == "function_call" and fc["name"] == "get_weather"
    jsonschema.validate(json.loads(fc["arguments"]), tool["parameters"])
    follow = [{"role": "user", "content": "weather?"}, {"type": "function_call", "call_id": fc["call_id"],
              "name": fc["name"], "arguments": fc["arguments"]},
              {"type": "function_call_output", "call_id": fc["call_id"], "output": "sunny"}]
    out = httpx.post(f"{sim.url}/v1/responses", timeout=30, json={
        "model": sim.model, "input": follow, "tools": [tool],
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}}}).json()
    msg = out["output"][0]
    assert msg["type"] == "message"
    jsonschema.validate(json.loads(msg["content"][0]["text"]), ANSWER)
    assert out["usage"]["input_tokens"] > 0 and out["usage"]["output_tokens"] > 0


def test_embeddings(sim: SimProc) -> None:
    r = httpx.post(f"{sim.url}/v1/embeddings", timeout=30,
                   json={"model": sim.model, "input": ["kv cache", "kv cache", "other"], "dimensions": 32})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2] and all(len(d["embedding"]) == 32 for d in data)
    assert data[0]["embedding"] == data[1]["embedding"] != data[2]["embedding"]
    assert math.isclose(sum(v * v for v in data[0]["embedding"]), 1.0, rel_tol=1e-9)
    assert r.json()["usage"]["prompt_tokens"] == 8 + 8 + 5
    bad = httpx.post(f"{sim.url}/v1/embeddings", timeout=30, json={"model": sim.model, "input": []})
    assert bad.status_code == 400
