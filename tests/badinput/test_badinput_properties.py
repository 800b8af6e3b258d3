"""Property-based: whatever body and taskplane headers a client sends, the gateway answers
below 500 (or the contract's 504 deadline_unmeetable for a budget that is too small), and
every refusal carries DESIGN.md's JSON error body.

hypothesis generates (a) arbitrary JSON documents, (b) valid chat/completion requests
with one field replaced by an arbitrary JSON value, (c) raw bytes, each with random
taskplane headers. (schemathesis would add little: the gateway reads its bodies raw, to
cap their size before parsing, so its /openapi.json has no body schema to generate from.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tp_badinput_env import KEYS

from taskplane.dev.local import LocalCluster

MODEL = "llama-3.1-8b"
SETTINGS = settings(max_examples=300, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: Strings with lone UTF-16 surrogates (json.dumps writes them as the escapes attackers send).
surrogate_text = st.builds(lambda a, c, b: a + c + b, st.text(max_size=8),
                           st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), st.text(max_size=8))
big_ints = st.sampled_from([2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 10**30, -(10**30)])
json_scalars = (st.none() | st.booleans() | st.integers() | big_ints | st.floats(allow_nan=False, allow_infinity=False)
                | st.text(max_size=40) | surrogate_text)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                           max_leaves=20)

FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
          "stream_options", "stop", "seed", "prompt"]
HEADERS = ["X-Taskplane-Tenant", "X-Taskplane-Task-Id", "X-Taskplane-Session-Id", "X-Taskplane-Step",
           "X-Taskplane-Steps-Remaining", "X-Taskplane-Priority", "X-Taskplane-Budget-Ms", "X-Taskplane-Sunk-Cost-Usd",
           "X-Taskplane-Allow-Fallback", "X-Taskplane-Agent", "X-Taskplane-Attempt", "X-Taskplane-Call-Id"]
header_values = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30),
    st.integers(min_value=-10**6, max_value=10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["critical", "interactive", "standard", "batch", "true", "false", "", "0", "-1", "1e309",
                     "2147483647", "2147483648", "9223372036854775808", "9" * 400, "1e300", "caf\xe9"]),
    st.integers(min_value=2**30, max_value=2**40).map(str),
).map(str.strip)  # HTTP itself forbids leading/trailing whitespace in a value
#: Header values go out as latin-1 bytes (httpx takes str headers as ASCII only).
headers_st = st.dictionaries(st.sampled_from(HEADERS), header_values.map(lambda v: v.encode("latin-1")), max_size=5)


def _valid(kind: str) -> dict[str, Any]:
    if kind == "chat":
        return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return {"model": MODEL, "prompt": "hi", "max_tokens": 4}


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["chat", "completions"]))
    body = _valid(kind)
    for _ in range(draw(st.integers(1, 3))):
        body[draw(st.sampled_from(FIELDS))] = draw(json_values)
    if draw(st.booleans()):
        body.pop(draw(st.sampled_from(sorted(body))), None)
    return kind, json.dumps(body).encode()


bodies = st.one_of(
    mutated(),
    st.tuples(st.sampled_from(["chat", "completions"]), json_values.map(lambda v: json.dumps(v).encode())),
    st.tuples(st.sampled_from(["chat", "completions"]), st.binary(max_size=200)),
)


@pytest.fixture(scope="module")
def client(guarded: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=guarded.gateway_url, timeout=30,
                      headers={"Authorization": f"Bearer {KEYS['acme']}", "Content-Type": "application/json"}) as c:
        yield c


def deep(depth: int) -> bytes:
    """A chat body with a field nested ``depth`` lists deep (json.dumps cannot write it)."""
    return (b'{"model": "llama-3.1-8b", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "x": '
            + b"[" * depth + b"]" * depth + b"}")


bodies = st.one_of(bodies, st.integers(1, 1200).map(lambda d: ("chat", deep(d))))


def _check(r: httpx.Response) -> None:
    if r.status_code == 504:  # DESIGN.md: a budget that cannot be met is 504 deadline_unmeetable, by contract
        assert r.json()["error"]["type"] == "deadline_unmeetable", r.text
        return
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["type"], str) and isinstance(err["message"], str)


@SETTINGS
@given(body=bodies, headers=headers_st)
def test_no_5xx_from_any_body_and_headers(client: httpx.Client, body: tuple[str, bytes], headers: dict[str, bytes]) -> None:
    kind, raw = body
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    payload = raw
    try:
        data = json.loads(raw)
        streamed = isinstance(data, dict) and data.get("stream") is True
    except ValueError:
        streamed = False
    if streamed:
        with client.stream("POST", path, content=payload, headers=headers) as r:
            r.read()
            _check(r)
    else:
        _check(client.post(path, content=payload, headers=headers))


@SETTINGS
@given(headers=headers_st)
def test_valid_body_with_random_headers_is_served_or_refused_cleanly(client: httpx.Client, headers: dict[str, bytes]) -> None:
    r = client.post("/v1/chat/completions", content=json.dumps(_valid("chat")).encode(), headers=headers)
    _check(r)
    assert r.status_code in (200, 400, 403, 429, 504), r.text


def test_nothing_leaked_after_the_properties(client: httpx.Client) -> None:
    """After all the generated cases: no replica has a call in flight, a good call is served."""
    from tp_badinput_env import ADMIN_TOKEN

    for _ in range(100):
        reps = client.get("/admin/replicas", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["replicas"]
        if not sum(r["inflight"] for r in reps):
            break
        time.sleep(0.05)
    assert sum(r["inflight"] for r in reps) == 0, reps
    r = client.post("/v1/chat/completions", content=json.dumps(_valid("chat")).encode())
    assert r.status_code == 200, r.text
