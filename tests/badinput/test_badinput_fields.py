"""Every body field and every taskplane header, one bad value class at a time (issue 20).

For each case: the answer is below 500 (or the contract's 504 deadline_unmeetable) with
DESIGN.md's JSON error body when refused; afterwards no replica has a call in flight
(nothing journalled or counted leaked), and a good call is served at once. The classes
are the ones found by an attacker (lone surrogates, integers beyond 64 and 32 bits,
nesting ~960 deep) and more: wrong types, empty and oversized values, NUL and control
characters, non-ASCII header bytes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from tp_badinput_env import ADMIN_TOKEN, KEYS, MAX_BODY
from tp_rawhttp import build_request, send_raw

from taskplane.dev.local import LocalCluster

MODEL = "llama-3.1-8b"


class Raw:
    """A JSON fragment spliced in as text (values json.dumps cannot write: lone surrogates
    as escapes are fine, but a number of 400 digits must be written by hand)."""

    def __init__(self, text: str) -> None:
        self.text = text


VALUES: dict[str, Any] = {
    "surrogate": "a\ud800b",
    "surrogate-low": "\udfff",
    "int64-over": 2**63,
    "int-400-digits": Raw("9" * 400),
    "int32-over": 2**31,
    "negative": -1,
    "zero": 0,
    "float-huge": 1e308,
    "fraction": 0.5,
    "deep-960": Raw("[" * 960 + "]" * 960),
    "deep-70": Raw("[" * 70 + "]" * 70),
    "empty-string": "",
    "empty-list": [],
    "empty-object": {},
    "object": {"a": {"b": [1, 2, {"c": None}]}},
    "nul-char": "a\u0000b",
    "control-chars": "\u0001\u001b[31m\u007f",
    "long-string": "x" * (MAX_BODY - 2000),
    "bool": True,
    "null": None,
}

CHAT_FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
               "stream_options", "stop", "seed", "user", "tools", "tool_choice", "logit_bias", "response_format",
               "presence_penalty", "logprobs", "top_logprobs", "metadata"]
MESSAGE_FIELDS = ["role", "content", "name", "tool_calls", "tool_call_id"]


def _chat(**over: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **over}


def _encode(body: Any) -> bytes:
    """JSON text of ``body`` with ``Raw`` fragments spliced in (ensure_ascii writes lone
    surrogates as the \\ud800 escapes an attacker sends)."""
    raws: list[str] = []

    def default(o: Any) -> Any:
        if isinstance(o, Raw):
            raws.append(o.text)
            return f"@@RAW{len(raws) - 1}@@"
        raise TypeError(type(o))

    text = json.dumps(body, default=default)
    for i, raw in enumerate(raws):
        text = text.replace(f'"@@RAW{i}@@"', raw)
    return text.encode()


def _body_cases() -> list[tuple[str, str, bytes]]:
    out = []
    for field in CHAT_FIELDS:
        for cls, value in VALUES.items():
            out.append((f"body.{field}={cls}", "/v1/chat/completions", _encode(_chat(**{field: value}))))
    for field in MESSAGE_FIELDS:
        for cls in ("surrogate", "int64-over", "deep-960", "nul-char", "object", "empty-list"):
            msg = {"role": "user", "content": "hi", field: VALUES[cls]}
            out.append((f"body.messages[0].{field}={cls}", "/v1/chat/completions", _encode(_chat(messages=[msg]))))
    for cls in ("surrogate", "deep-960", "int64-over", "nul-char"):
        part = {"type": "text", "text": VALUES[cls]}
        out.append((f"body.messages[0].content[0].text={cls}", "/v1/chat/completions",
                    _encode(_chat(messages=[{"role": "user", "content": [part]}]))))
    for cls, value in VALUES.items():
        out.append((f"completions.prompt={cls}", "/v1/completions", _encode({"model": MODEL, "max_tokens": 4, "prompt": value})))
    return out


HEADERS = ["X-Taskplane-Tenant", "X-Taskplane-Task-Id", "X-Taskplane-Session-Id", "X-Taskplane-Step",
           "X-Taskplane-Steps-Remaining", "X-Taskplane-Priority", "X-Taskplane-Budget-Ms", "X-Taskplane-Sunk-Cost-Usd",
           "X-Taskplane-Allow-Fallback", "X-Taskplane-Agent", "X-Taskplane-Attempt", "X-Taskplane-Call-Id"]
HEADER_VALUES = {
    "int32-over": "2147483648",
    "int32-max": "2147483647",
    "int64-over": "9223372036854775808",
    "400-digits": "9" * 400,
    "negative": "-1",
    "float-huge": "1e308",
    "nan": "nan",
    "inf": "inf",
    "latin1-bytes": "caf\xe9-\xff",
    "control-char": "a\x01b",
    "long": "x" * 300,
    "spaces-inside": "a b  c",
}


def _header_cases() -> list[tuple[str, str, dict[str, str]]]:
    return [(f"header.{h}={cls}", h, {h: v}) for h in HEADERS for cls, v in HEADER_VALUES.items()]


BODY_CASES = _body_cases()
HEADER_CASES = _header_cases()


def test_the_field_matrix_is_big_enough() -> None:
    assert len(BODY_CASES) + len(HEADER_CASES) >= 250


@pytest_asyncio.fixture(scope="module")
async def client(guarded: LocalCluster) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=guarded.gateway_url, timeout=30) as c:
        yield c


async def _inflight(client: httpx.AsyncClient) -> int:
    reps = (await client.get("/admin/replicas", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})).json()["replicas"]
    return sum(int(r["inflight"]) for r in reps)


def _answer_ok(status: int, body: bytes) -> None:
    if status == 504:
        assert json.loads(body)["error"]["type"] == "deadline_unmeetable", body[:300]
        return
    assert status < 500, (status, body[:300])
    if status >= 400:
        err = json.loads(body)["error"]
        assert isinstance(err["type"], str) and isinstance(err["message"], str)


async def _nothing_left_and_good_call_served(client: httpx.AsyncClient) -> None:
    for _ in range(100):  # a stream settles just after its last byte
        if not await _inflight(client):
            break
        await asyncio.sleep(0.02)
    assert await _inflight(client) == 0, "a replica kept a call in flight"
    r = await client.post("/v1/chat/completions", json=_chat(), headers={"Authorization": f"Bearer {KEYS['acme']}"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("name", "path", "raw"), BODY_CASES, ids=[c[0] for c in BODY_CASES])
async def test_bad_body_field(guarded: LocalCluster, client: httpx.AsyncClient, name: str, path: str, raw: bytes) -> None:
    headers = [("Authorization", f"Bearer {KEYS['acme']}"), ("Content-Type", "application/json")]
    resp = await send_raw(guarded.gateway_port, build_request("POST", path, headers, raw), timeout=30)
    assert not resp.closed_without_answer
    _answer_ok(resp.status, resp.body)
    await _nothing_left_and_good_call_served(client)


@pytest.mark.parametrize(("name", "header", "extra"), HEADER_CASES, ids=[c[0] for c in HEADER_CASES])
async def test_bad_header(guarded: LocalCluster, client: httpx.AsyncClient, name: str, header: str,
                          extra: dict[str, str]) -> None:
    headers = [("Authorization", f"Bearer {KEYS['acme']}"), ("Content-Type", "application/json"), *extra.items()]
    resp = await send_raw(guarded.gateway_port, build_request("POST", "/v1/chat/completions", headers,
                                                              json.dumps(_chat()).encode()), timeout=30)
    assert not resp.closed_without_answer
    _answer_ok(resp.status, resp.body)
    if resp.status == 200 and header in ("X-Taskplane-Step", "X-Taskplane-Attempt", "X-Taskplane-Steps-Remaining"):
        assert int(extra[header]) < 2**31, "a value beyond the int32 column was served (its row would be dead-lettered)"
    await _nothing_left_and_good_call_served(client)
