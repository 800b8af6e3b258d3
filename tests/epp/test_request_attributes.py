"""The routing filter sends the picker one message per call, the body with the request's
headers as attributes (``envoy_names.REQUEST_ATTRIBUTES``). Everything a headers message
would carry must hold without one: a body-less request is refused with the contract's JSON
error and never reaches a replica (the picker gets no message for it), a GET is the app's,
repeated taskplane headers with different values, missing or wrong keys and a priority above
the tenant's cap are refused by the picker, and what reaches the replica carries none of the
client's taskplane, ``x-envoy-*`` or ``authorization`` headers."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from tp_epp_helpers import MODEL, chat, messages_cost
from tp_recording_upstream import RecordingUpstream

from taskplane.dev import processes as proc
from taskplane.ports import free_port

KEY, CAPPED_KEY = "tp-key-acme-one", "tp-key-capped-one"
ADMIN = "tp-admin-one"
#: What a successful stream costs the picker: the body's message alone.
STREAM_COST = {"request_headers": 0, "request_body": 1, "response_headers": 0, "response_body": 0, "answers_streams": 0}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, RecordingUpstream]]:
    """A gateway with auth on over one recording replica; (url, replica)."""
    work = Path(tmp_path_factory.mktemp("attributes"))
    upstream = RecordingUpstream(free_port()).start()
    port = free_port()
    cfg = {"pools": [{"model": MODEL, "replicas": [{"url": f"http://127.0.0.1:{upstream.port}", "name": "rec", "gpu": "h100"}]}],
           "auth": True, "admin_token_sha256": _sha(ADMIN),
           "tenants": [{"id": "acme", "api_key_sha256": _sha(KEY), "max_priority": "critical"},
                       {"id": "capped", "api_key_sha256": _sha(CAPPED_KEY), "max_priority": "standard"}],
           "outbox_dir": str(work / "outbox")}
    (work / "gw.yaml").write_text(yaml.safe_dump(cfg))
    log = work / "gateway.log"
    pid = proc.spawn([sys.executable, "-m", "taskplane.cli", "gateway", "--config", str(work / "gw.yaml"), "--port", str(port)],
                     log, env={"TASKPLANE_STATE_DIR": str(work), "TASKPLANE_DATA_PLANE": "envoy"})
    try:
        proc.wait_until(proc.http_ok(f"http://127.0.0.1:{port}/healthz"), "gateway", 60, pid, log)
        yield f"http://127.0.0.1:{port}", upstream
    finally:
        proc.stop_pid(pid)
        upstream.stop()


def _client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=30, headers={"Authorization": f"Bearer {ADMIN}"})


async def _refused(url: str, upstream: RecordingUpstream, method: str, headers: list[tuple[str, str]],
                   body: bytes | None = None) -> tuple[httpx.Response, dict[str, int]]:
    """Send one request that must be refused; assert no replica saw it; (answer, picker messages)."""
    seen = len(upstream.seen)
    async with _client(url) as admin, httpx.AsyncClient(base_url=url, timeout=30) as client:
        got: list[httpx.Response] = []

        async def send() -> None:
            got.append(await client.request(method, "/v1/chat/completions", headers=headers, content=body))

        cost = await messages_cost(admin, send())
    assert len(upstream.seen) == seen, f"a refused request reached the replica: {upstream.seen[seen:]}"
    return got[0], cost


def _json_body(**kw: object) -> bytes:
    return httpx.Request("POST", "http://x", json=chat("one", **kw)).content


async def test_a_stream_costs_one_message_and_reaches_the_replica_stripped(
        recorded: tuple[str, RecordingUpstream]) -> None:
    url, upstream = recorded
    headers = {"Authorization": f"Bearer {KEY}", "X-Taskplane-Task-Id": "one-1", "X-Taskplane-Priority": "critical",
               "X-Taskplane-Unknown": "x", "X-Envoy-Retry-On": "5xx", "X-Envoy-Upstream-Rq-Timeout-Ms": "1",
               "X-Envoy-Whatever": "y"}
    async with _client(url) as admin, httpx.AsyncClient(base_url=url, timeout=30) as client:
        got: list[httpx.Response] = []

        async def stream() -> None:
            got.append(await client.post("/v1/chat/completions", json=chat("one", stream=True), headers=headers))

        cost = await messages_cost(admin, stream())
    r = got[0]
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text
    assert r.headers["x-taskplane-replica"] == "rec" and r.headers["cache-control"] == "no-cache"
    assert cost == STREAM_COST, cost
    method, path, seen = upstream.seen[-1]
    assert (method, path) == ("POST", "/v1/chat/completions")
    leaked = sorted(k for k in seen if k.startswith(("x-taskplane-", "x-envoy-")) or k == "authorization")
    assert leaked == [], f"client headers reached the replica: {leaked}"
    # the routing answer's headers reached it (Envoy applied none of them itself: the request guard set them)
    assert seen["x-gateway-destination-endpoint"] == f"127.0.0.1:{upstream.port}"
    assert seen["content-type"] == "application/json" and "transfer-encoding" not in seen


async def test_a_unary_call_costs_one_more_stream_through_the_answers_filter(recorded: tuple[str, RecordingUpstream]) -> None:
    url, _ = recorded
    async with _client(url) as admin, httpx.AsyncClient(base_url=url, timeout=30) as client:
        got: list[httpx.Response] = []

        async def unary() -> None:
            got.append(await client.post("/v1/chat/completions", json=chat("one"), headers={"Authorization": f"Bearer {KEY}"}))

        cost = await messages_cost(admin, unary())
    r = got[0]
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    assert float(r.headers["x-taskplane-cost-usd"]) > 0
    assert cost == {**STREAM_COST, "response_headers": 1, "response_body": 1, "answers_streams": 1}, cost


@pytest.mark.parametrize("shape", ["no-body", "content-length-0"])
async def test_a_body_less_post_gets_the_contracts_400_and_no_replica_sees_it(
        recorded: tuple[str, RecordingUpstream], shape: str) -> None:
    url, upstream = recorded
    headers = [("Authorization", f"Bearer {KEY}")] + ([("Content-Length", "0")] if shape == "content-length-0" else [])
    r, cost = await _refused(url, upstream, "POST", headers)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json() == {"error": {"type": "invalid_request", "message": "request body is missing"}}
    assert cost["request_body"] == 0


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_a_get_on_an_inference_path_is_refused_and_no_replica_sees_it(
        recorded: tuple[str, RecordingUpstream], method: str) -> None:
    url, upstream = recorded
    r, cost = await _refused(url, upstream, method, [("Authorization", f"Bearer {KEY}")])
    assert r.status_code == 405
    if method == "GET":
        assert r.json()["error"]["type"] == "invalid_request"
    assert cost["request_headers"] == cost["request_body"] == 0


@pytest.mark.parametrize(("headers", "status", "error_type"), [
    ([("X-Taskplane-Task-Id", "task-a"), ("X-Taskplane-Task-Id", "task-b")], 400, "invalid_request"),
    ([("X-Taskplane-Priority", "batch"), ("X-Taskplane-Priority", "critical")], 400, "invalid_request"),
    ([("Authorization", f"Bearer {KEY}"), ("Authorization", f"Bearer {CAPPED_KEY}")], 400, "invalid_request"),
    ([], 401, "unauthorized"),
    ([("Authorization", "Bearer not-a-key")], 401, "unauthorized"),
    ([("Authorization", f"Bearer {CAPPED_KEY}"), ("X-Taskplane-Priority", "critical")], 403, "forbidden"),
    ([("Authorization", f"Bearer {KEY}"), ("X-Taskplane-Tenant", "capped")], 403, "forbidden"),
], ids=["task-id-twice", "priority-twice", "two-keys", "no-key", "wrong-key", "priority-over-cap", "other-tenant"])
async def test_the_picker_refuses_headers_as_before(recorded: tuple[str, RecordingUpstream],
                                                    headers: list[tuple[str, str]], status: int, error_type: str) -> None:
    url, upstream = recorded
    auth = [] if any(k == "Authorization" for k, _ in headers) or status == 401 else [("Authorization", f"Bearer {KEY}")]
    r, cost = await _refused(url, upstream, "POST", [*auth, *headers, ("Content-Type", "application/json")], _json_body())
    assert r.status_code == status and r.json()["error"]["type"] == error_type, r.text
    assert cost["request_body"] == 1


async def test_the_same_header_twice_with_one_value_is_served(recorded: tuple[str, RecordingUpstream]) -> None:
    url, upstream = recorded
    seen = len(upstream.seen)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        r = await client.post("/v1/chat/completions", content=_json_body(stream=True),
                              headers=[("Authorization", f"Bearer {KEY}"), ("X-Taskplane-Task-Id", "same"),
                                       ("X-Taskplane-Task-Id", "same"), ("Content-Type", "application/json")])
    assert r.status_code == 200 and len(upstream.seen) == seen + 1, r.text
