"""Structured outputs on real vLLM: with random weights, ``tool_choice="required"`` / a named
function and ``response_format: json_schema`` still give output that parses and matches
the schema (vLLM's guided decoding), so the SDK's tool calls and ``response.parsed`` work
on the real tier exactly as on the simulated one."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import pytest
from vllm_helpers import MODEL

from taskplane.engines.vllm_launcher import VllmOptions, VllmReplica, start_replicas, stop_replicas

# Finite grammars (enums, booleans): random weights cannot wander into an endless string.
PARAMS = {"type": "object", "properties": {"city": {"enum": ["oslo", "rome", "lima"]}, "metric": {"type": "boolean"}},
          "required": ["city", "metric"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": PARAMS}},
         {"type": "function", "function": {"name": "get_time", "description": "time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
             "additionalProperties": False}}}]
VERDICT = {"type": "object", "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "high"]}},
           "required": ["ok", "level"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmReplica]:
    """A replica as structured outputs need it: EOS in the output vocabulary (the grammar must
    be able to stop), a tool parser set (vLLM requires one for tool_choice), no free whitespace
    in guided JSON (random weights would fill max_tokens with it)."""
    extra = ["--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
             "--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})]
    replicas = start_replicas(tmp_path_factory.mktemp("vllm-structured"), 1,
                              VllmOptions(model_name=MODEL, num_blocks=32, samples_eos=True, extra_args=extra))
    try:
        yield replicas[0]
    finally:
        stop_replicas(replicas)


def _chat(http: httpx.Client, replica: VllmReplica, **kw: object) -> dict[str, object]:
    r = http.post(f"{replica.url}/v1/chat/completions",
                  json={"model": MODEL, "messages": MESSAGES, "max_tokens": 200, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_tool_choice_required_gives_schema_valid_calls(replica: VllmReplica, http: httpx.Client) -> None:
    # parallel_tool_calls=False: vLLM's grammar then allows one call (maxItems 1); with parallel
    # calls allowed, random weights would keep appending calls until max_tokens
    body = _chat(http, replica, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    message = body["choices"][0]["message"]  # type: ignore[index]
    calls = message["tool_calls"]
    assert calls, message
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for c in calls:
        assert c["function"]["name"] in schemas
        jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])


def test_named_tool_choice_calls_that_tool(replica: VllmReplica, http: httpx.Client) -> None:
    body = _chat(http, replica, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = body["choices"][0]["message"]["tool_calls"]  # type: ignore[index]
    assert [c["function"]["name"] for c in calls] == ["get_time"]
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), TOOLS[1]["function"]["parameters"])


def test_json_schema_response_format_is_valid(replica: VllmReplica, http: httpx.Client) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT}}
    for seed in range(3):
        body = _chat(http, replica, response_format=fmt, temperature=1.0, seed=seed)
        content = body["choices"][0]["message"]["content"]  # type: ignore[index]
        jsonschema.validate(json.loads(content), VERDICT)
