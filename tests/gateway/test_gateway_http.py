"""The gateway end to end over HTTP: placement, headers, errors, retries, cost rows."""

from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import httpx
import pytest

from taskplane.dev.local import LocalCluster

MODEL = "llama-3.1-8b"


def _headers(session: str, step: int, **extra: str) -> dict[str, str]:
    return {"X-Taskplane-Tenant": "acme", "X-Taskplane-Task-Id": session, "X-Taskplane-Step": str(step),
            "X-Taskplane-Call-Id": f"{session}:{step}", "X-Taskplane-Attempt": "1", **extra}


def _chat(history: list[dict[str, str]], **kw: object) -> dict[str, object]:
    return {"model": MODEL, "messages": history, "max_tokens": 8, **kw}


async def _rows(pg_url: str, task_id: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(pg_url.replace("+asyncpg", ""))
    try:
        return list(await conn.fetch("SELECT * FROM llm_calls WHERE task_id=$1 ORDER BY started_at", task_id))
    finally:
        await conn.close()


async def _rows_eventually(pg_url: str, task_id: str, n: int) -> list[asyncpg.Record]:
    for _ in range(100):
        rows = await _rows(pg_url, task_id)
        if len(rows) >= n:
            return rows
        await asyncio.sleep(0.1)
    return await _rows(pg_url, task_id)


async def test_session_stays_on_its_replica_and_rows_are_recorded(cluster: LocalCluster, pg_url: str) -> None:
    task = f"t-{uuid.uuid4().hex[:8]}"
    history = [{"role": "system", "content": "You are a careful agent. " * 20}]
    replicas = set()
    async with httpx.AsyncClient(base_url=cluster.gateway_url, timeout=30) as client:
        for step in range(4):
            history.append({"role": "user", "content": f"tool result {step}: " + "data " * 30})
            r = await client.post("/v1/chat/completions", json=_chat(history), headers=_headers(task, step))
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["usage"]["prompt_tokens"] > 0
            assert r.headers["X-Taskplane-Model"] == MODEL
            assert float(r.headers["X-Taskplane-Cost-Usd"]) > 0
            replicas.add(r.headers["X-Taskplane-Replica"])
            if step > 0:
                assert int(r.headers["X-Taskplane-Cached-Tokens"]) > 0, "a warm session should hit its prefix cache"
            history.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
    assert len(replicas) == 1
    rows = await _rows_eventually(pg_url, task, 4)
    assert len(rows) == 4
    assert {r["outcome"] for r in rows} == {"success"}
    assert all(r["cost_usd"] > 0 and r["replica"] in replicas for r in rows)


async def test_killed_replica_is_retried_elsewhere_with_both_attempts_recorded(pg_url: str, tmp_path) -> None:
    c = LocalCluster(tmp_path, replicas=2, database_url=pg_url)
    with c:
        task = f"t-{uuid.uuid4().hex[:8]}"
        history = [{"role": "user", "content": "hello " * 50}]
        async with httpx.AsyncClient(base_url=c.gateway_url, timeout=30) as client:
            r = await client.post("/v1/chat/completions", json=_chat(history), headers=_headers(task, 0))
            assert r.status_code == 200
            first = r.headers["X-Taskplane-Replica"]
            # the replica dies as the next call reaches it (a kill before it could race the
            # gateway's 1 s health scrape, which would take the replica out before the call)
            dying = c.replicas[[x.name for x in c.replicas].index(first)]
            (await client.post(f"{dying.url}/admin/faults", json={"crash_after": 1})).raise_for_status()
            r = await client.post("/v1/chat/completions", json=_chat(history), headers=_headers(task, 1))
            assert r.status_code == 200, r.text
            assert r.headers["X-Taskplane-Replica"] != first
        rows = await _rows_eventually(pg_url, task, 3)
        step1 = [r for r in rows if r["step"] == 1]
        assert sorted(r["outcome"] for r in step1) == ["error", "success"]
        assert len({r["attempt_key"] for r in rows}) == len(rows)


@pytest.mark.parametrize(
    ("body", "headers", "status", "etype"),
    [
        (b"{not json", {}, 400, "invalid_request"),
        (json.dumps({"model": MODEL}).encode(), {}, 400, "invalid_request"),
        (json.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]}).encode(), {}, 404, "model_not_found"),
        (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}).encode(), {}, 400, "invalid_request"),
        (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 9000}]}).encode(), {}, 400, "invalid_request"),
        (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).encode(),
         {"X-Taskplane-Priority": "urgent"}, 400, "invalid_request"),
        (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).encode(),
         {"X-Taskplane-Budget-Ms": "-5"}, 400, "invalid_request"),
        (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).encode(),
         {"X-Taskplane-Tenant": "globex", "X-Taskplane-Priority": "critical"}, 403, "forbidden"),
        (b"\xff\xfe\x00", {}, 400, "invalid_request"),
    ],
)
async def test_bad_input_gets_a_clear_4xx(cluster: LocalCluster, body: bytes, headers: dict[str, str], status: int, etype: str) -> None:
    async with httpx.AsyncClient(base_url=cluster.gateway_url, timeout=30) as client:
        r = await client.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json", **headers})
    assert r.status_code == status, r.text
    assert r.json()["error"]["type"] == etype
    assert r.json()["error"]["message"]


async def test_streaming_passes_through_with_usage_when_asked(cluster: LocalCluster) -> None:
    req = _chat([{"role": "user", "content": "stream please"}], stream=True, stream_options={"include_usage": True})
    chunks = []
    async with httpx.AsyncClient(base_url=cluster.gateway_url, timeout=30) as client:
        async with client.stream("POST", "/v1/chat/completions", json=req, headers={"X-Taskplane-Tenant": "acme"}) as r:
            assert r.status_code == 200
            assert r.headers["X-Taskplane-Replica"].startswith("replica-")
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
    assert any(c.get("usage") for c in chunks)
    text = "".join((c["choices"][0].get("delta") or {}).get("content") or "" for c in chunks if c.get("choices"))
    assert text


async def test_models_health_metrics_admin(cluster: LocalCluster) -> None:
    async with httpx.AsyncClient(base_url=cluster.gateway_url, timeout=30) as client:
        assert (await client.get("/v1/models")).json()["data"][0]["id"] == MODEL
        assert (await client.get("/healthz")).json()["healthy_replicas"] == 3
        prom = (await client.get("/metrics")).text
        assert "taskplane_gateway_requests_total" in prom
        for name in ("taskplane_scheduler_pins_broken_total", "taskplane_kvindex_blocks", "taskplane_scheduler_decisions_total"):
            assert name in prom, f"scheduler metric {name} missing from the gateway's /metrics"
        reps = (await client.get("/admin/replicas")).json()["replicas"]
        assert {r["gpu"] for r in reps} == {"h100", "l40s"}
