"""`taskplane gateway` on the Envoy data plane: routing, sessions, headers, errors and
exactly one row per attempt with the engine's exact usage."""

from __future__ import annotations

import uuid

import httpx
from tp_epp_helpers import MODEL, chat, rows_eventually, sse_usage, tp_headers

from taskplane.dev.local import LocalCluster


def _task() -> str:
    return f"epp-{uuid.uuid4().hex[:8]}"


async def test_served_by_envoy_with_taskplane_headers_and_exact_unary_row(door: LocalCluster, pg_url: str) -> None:
    task = _task()
    async with httpx.AsyncClient(base_url=door.gateway_url, timeout=30) as client:
        r = await client.post("/v1/chat/completions", json=chat("hello"), headers=tp_headers(task, 0))
    assert r.status_code == 200, r.text
    assert r.headers["server"] == "envoy"
    usage = r.json()["usage"]
    assert r.headers["x-taskplane-model"] == MODEL
    assert r.headers["x-taskplane-replica"].startswith("replica-")
    assert r.headers["x-taskplane-gpu"] in ("h100", "l40s")
    assert float(r.headers["x-taskplane-cost-usd"]) > 0
    assert int(r.headers["x-taskplane-cached-tokens"]) == usage["prompt_tokens_details"]["cached_tokens"]
    got = await rows_eventually(pg_url, task, 1)
    assert len(got) == 1
    row = got[0]
    assert row["outcome"] == "success" and row["replica"] == r.headers["x-taskplane-replica"]
    assert (row["prompt_tokens"], row["completion_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert row["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]


async def test_stream_row_has_exact_usage_and_usage_stays_hidden_unless_asked(door: LocalCluster, pg_url: str) -> None:
    task = _task()
    async with httpx.AsyncClient(base_url=door.gateway_url, timeout=30) as client:
        asked = await client.post("/v1/chat/completions", json=chat("stream one", stream=True, max_tokens=12,
                                                                    stream_options={"include_usage": True}),
                                  headers=tp_headers(task, 0))
        plain = await client.post("/v1/chat/completions", json=chat("stream two", stream=True, max_tokens=12),
                                  headers=tp_headers(task, 1))
    for r in (asked, plain):
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        assert "content-length" not in r.headers
        assert r.text.rstrip().endswith("data: [DONE]")
        assert r.headers["x-taskplane-replica"].startswith("replica-")
    usage = sse_usage(asked.text)
    assert usage is not None
    assert sse_usage(plain.text) is None, "usage was forced upstream for the row; the client did not ask for it"
    got = await rows_eventually(pg_url, task, 2)
    assert [r["outcome"] for r in got] == ["success", "success"]
    first = next(r for r in got if r["step"] == 0)
    assert (first["prompt_tokens"], first["completion_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert first["ttft_ms"] is not None and 0 <= first["ttft_ms"] <= first["total_ms"] + 1
    second = next(r for r in got if r["step"] == 1)
    assert second["completion_tokens"] == 12


async def test_session_stays_on_its_replica(door: LocalCluster) -> None:
    task = _task()
    seen = []
    async with httpx.AsyncClient(base_url=door.gateway_url, timeout=30) as client:
        for step in range(4):
            r = await client.post("/v1/chat/completions", json=chat("same session " * (step + 1)),
                                  headers=tp_headers(task, step, **{"X-Taskplane-Session-Id": task}))
            assert r.status_code == 200, r.text
            seen.append(r.headers["x-taskplane-replica"])
            if step:
                assert int(r.headers["x-taskplane-cached-tokens"]) > 0, "a warm session should hit its prefix cache"
    assert len(set(seen)) == 1, seen


async def test_errors_are_the_contract_json(door: LocalCluster, pg_url: str) -> None:
    async with httpx.AsyncClient(base_url=door.gateway_url, timeout=30) as client:
        bad = await client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        unknown = await client.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        cap = await client.post("/v1/chat/completions", json=chat("x"),
                                headers={"X-Taskplane-Tenant": "globex", "X-Taskplane-Priority": "critical"})
        no_route = await client.get("/v2/nothing")
        models = await client.get("/v1/models")
        health = await client.get("/healthz")
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request"
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "model_not_found"
    assert cap.status_code == 403 and cap.json()["error"]["type"] == "forbidden"
    assert no_route.status_code == 404 and "error" in no_route.json()
    assert models.status_code == 200 and models.json()["data"][0]["id"] == MODEL
    assert health.status_code == 200


async def test_body_too_large_is_refused_by_envoy_in_the_contract_shape(door: LocalCluster) -> None:
    big = b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "' + b"x" * (5 * 1024 * 1024) + b'"}]}'
    async with httpx.AsyncClient(base_url=door.gateway_url, timeout=30) as client:
        r = await client.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["type"] == "payload_too_large"
