"""Security properties of the gateway, each checked against real processes: hashed keys
compared in constant time, auth on by default, tenants kept apart in /reports, admin
endpoints behind the admin token, the priority cap, limits, and no secret in any log."""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from tp_rel_env import ADMIN_TOKEN, KEYS, bearer, secured_config

from taskplane.calls import auth
from taskplane.config import GatewayConfig, parse_gateway_config
from taskplane.dev.local import LocalCluster
from taskplane.dev.parts import gateway_config as dev_gateway_config

MODEL = "llama-3.1-8b"


def _chat(text: str, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4, **kw}


# ---- keys: hashed, constant time, auth on by default -------------------------------------

def test_the_config_holds_only_digests(secure: LocalCluster) -> None:
    text = (secure.workdir / "gateway.yaml").read_text()
    for secret in [*KEYS.values(), ADMIN_TOKEN]:
        assert secret not in text
        assert auth.sha256_hex(secret) in text


def test_auth_is_on_unless_the_config_turns_it_off() -> None:
    cfg = parse_gateway_config({"pools": [{"model": MODEL}]})
    assert cfg.auth is True
    assert GatewayConfig.model_fields["auth"].default is True
    # only `taskplane dev` (a local, single-user stack) writes auth: false
    assert dev_gateway_config({"replicas": []})["auth"] is False


def test_key_comparison_is_constant_time_over_tenants(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tenant's digest is compared with hmac.compare_digest, whether the key matches the
    first tenant, the last or none: the time does not tell which tenant (or how much) matched."""
    cfg = parse_gateway_config(secured_config(tenants=[
        {"id": f"t{i}", "api_key_sha256": auth.sha256_hex(f"key-{i}")} for i in range(6)]) | {"pools": [{"model": MODEL}]})
    calls: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def counting(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    for key, expect in [("key-0", "t0"), ("key-5", "t5"), ("wrong", None)]:
        calls.clear()
        try:
            got = auth.authenticate(cfg, {"authorization": f"Bearer {key}"})
        except Exception:
            got = None
        assert got == expect
        assert len(calls) == 6, "one constant-time comparison per tenant, always"
        assert all(len(a) == len(b) == 64 for a, b in calls)


async def test_calls_need_a_key_and_the_right_one(secure: LocalCluster) -> None:
    async with httpx.AsyncClient(base_url=secure.gateway_url, timeout=30) as client:
        assert (await client.post("/v1/chat/completions", json=_chat("hi"))).status_code == 401
        assert (await client.post("/v1/chat/completions", json=_chat("hi"), headers={"X-Taskplane-Tenant": "acme"})).status_code == 401
        r = await client.post("/v1/chat/completions", json=_chat("hi"), headers={"Authorization": f"Bearer {KEYS['acme']}x"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized"
        assert (await client.post("/v1/chat/completions", json=_chat("hi"), headers=bearer("acme"))).status_code == 200


# ---- admin endpoints and tenant isolation ---------------------------------------------------

async def test_admin_endpoints_need_the_admin_token(secure: LocalCluster) -> None:
    async with httpx.AsyncClient(base_url=secure.gateway_url, timeout=30) as client:
        for path in ("/admin/replicas",):
            assert (await client.get(path)).status_code == 401
            r = await client.get(path, headers=bearer("acme"))
            assert r.status_code == 403 and r.json()["error"]["type"] == "forbidden"
            assert (await client.get(path, headers={"Authorization": "Bearer not-the-token"})).status_code in (401, 403)
            assert (await client.get(path, headers=bearer("admin"))).status_code == 200
        assert (await client.get("/reports")).status_code == 401


async def _wait_rows(pg_url: str, task_ids: list[str], n: int) -> None:
    import asyncpg

    conn = await asyncpg.connect(pg_url.replace("+asyncpg", ""))
    try:
        for _ in range(100):
            got = await conn.fetchval("SELECT count(*) FROM llm_calls WHERE task_id = ANY($1::text[])", task_ids)
            if got >= n:
                return
            await asyncio.sleep(0.1)
    finally:
        await conn.close()
    raise AssertionError("cost rows did not land")


async def test_a_tenant_reports_only_its_own_tasks_and_costs(secure: LocalCluster, pg_url: str) -> None:
    mark = uuid.uuid4().hex[:6]
    acme_task, globex_task = f"acme-task-{mark}", f"globex-task-{mark}"
    async with httpx.AsyncClient(base_url=secure.gateway_url, timeout=60) as client:
        for who, task in (("acme", acme_task), ("globex", globex_task)):
            for step in range(2):
                r = await client.post("/v1/chat/completions", json=_chat(f"{who} step {step}"),
                                      headers={**bearer(who), "X-Taskplane-Task-Id": task, "X-Taskplane-Step": str(step)})
                assert r.status_code == 200, r.text
        await _wait_rows(pg_url, [acme_task, globex_task], 4)
        mine = await client.get("/reports", headers=bearer("acme"))
        theirs = await client.get("/reports", headers=bearer("globex"))
        everyone = await client.get("/reports", headers=bearer("admin"))
    assert mine.status_code == theirs.status_code == everyone.status_code == 200, mine.text[:300]
    assert "globex" not in mine.text and "acme" in mine.text
    assert "acme" not in theirs.text and "globex" in theirs.text
    assert "acme" in everyone.text and "globex" in everyone.text


async def test_a_tenant_cannot_claim_another_tenant(secure: LocalCluster) -> None:
    async with httpx.AsyncClient(base_url=secure.gateway_url, timeout=30) as client:
        r = await client.post("/v1/chat/completions", json=_chat("hi"), headers={**bearer("acme"), "X-Taskplane-Tenant": "globex"})
        assert r.status_code == 403 and r.json()["error"]["type"] == "forbidden"
        r = await client.get("/reports", headers={**bearer("acme"), "X-Taskplane-Tenant": "globex"})
        assert "globex" not in r.text


async def test_priority_above_the_cap_is_refused_not_lowered(secure: LocalCluster) -> None:
    async with httpx.AsyncClient(base_url=secure.gateway_url, timeout=30) as client:
        before = (await client.get("/metrics")).text.count('outcome="success"')
        for prio in ("critical", "interactive"):
            r = await client.post("/v1/chat/completions", json=_chat("hi"), headers={**bearer("globex"), "X-Taskplane-Priority": prio})
            assert r.status_code == 403 and r.json()["error"]["type"] == "forbidden"
            assert prio in r.json()["error"]["message"]
        for prio in ("standard", "batch"):
            r = await client.post("/v1/chat/completions", json=_chat("hi"), headers={**bearer("globex"), "X-Taskplane-Priority": prio})
            assert r.status_code == 200
        assert (await client.get("/metrics")).text.count('outcome="success"') >= before


# ---- limits ------------------------------------------------------------------------------------

async def test_limits_body_headers_and_max_tokens(secure: LocalCluster) -> None:
    async with httpx.AsyncClient(base_url=secure.gateway_url, timeout=30) as client:
        r = await client.post("/v1/chat/completions", content=b"{" + b" " * 70000 + b"}", headers=bearer("acme"))
        assert r.status_code == 413 and r.json()["error"]["type"] == "payload_too_large"
        r = await client.post("/v1/chat/completions", json=_chat("hi"), headers={**bearer("acme"), "X-Pad": "p" * 70000})
        assert r.status_code == 431 and r.json()["error"]["type"] == "invalid_request"
        r = await client.post("/v1/chat/completions", json=_chat("hi", max_tokens=1025), headers=bearer("acme"))
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
        r = await client.post("/v1/chat/completions", json=_chat("hi", max_tokens=1024), headers=bearer("acme"))
        assert r.status_code == 200


async def test_concurrent_requests_per_tenant_are_capped(secure: LocalCluster) -> None:
    """globex may have 2 calls in flight: the rest get 429 with Retry-After, acme is not
    affected, and once the calls finish (streams too, even abandoned ones) globex is served."""
    async with httpx.AsyncClient(base_url=secure.gateway_url, timeout=60) as client:
        for r in secure.replicas:
            await client.post(f"{r.url}/admin/faults", json={"slow": 1000})
        try:
            slow = _chat("slow call", max_tokens=16)
            results = await asyncio.gather(*(client.post("/v1/chat/completions", json=slow, headers=bearer("globex"))
                                             for _ in range(6)),
                                           client.post("/v1/chat/completions", json=slow, headers=bearer("acme")))
            globex, acme = results[:6], results[6]
            codes = sorted(r.status_code for r in globex)
            assert codes == [200, 200, 429, 429, 429, 429], codes
            refused = next(r for r in globex if r.status_code == 429)
            assert refused.json()["error"]["type"] == "overloaded" and int(refused.headers["Retry-After"]) >= 1
            assert acme.status_code == 200
            # abandon two streams mid-way: their slots must come back
            for _ in range(2):
                async with client.stream("POST", "/v1/chat/completions", json={**slow, "stream": True}, headers=bearer("globex")) as s:
                    assert s.status_code == 200
                    async for _line in s.aiter_lines():
                        break
        finally:
            for r in secure.replicas:
                await client.post(f"{r.url}/admin/faults", json={"clear": True})
        for _ in range(50):
            reps = (await client.get("/admin/replicas", headers=bearer("admin"))).json()["replicas"]
            if all(x["inflight"] == 0 for x in reps):
                break
            await asyncio.sleep(0.1)
        ok = await asyncio.gather(*(client.post("/v1/chat/completions", json=_chat("again"), headers=bearer("globex")) for _ in range(2)))
        assert [r.status_code for r in ok] == [200, 200]


# ---- nothing secret in the logs --------------------------------------------------------------

SECRET_PROMPT = "zebra-quokka-7781-TOPSECRET-PROMPT"


async def test_prompts_and_keys_never_reach_the_logs(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway at debug level serves real calls whose prompts carry a distinctive secret,
    through every path that logs (success, stream, abandoned stream, bad body, too long,
    unknown model, wrong key, replica errors and a killed replica); then its log file is
    searched for the prompt and for every key."""
    monkeypatch.setenv("TASKPLANE_LOG_LEVEL", "debug")
    c = LocalCluster(tmp_path, replicas=3, database_url=pg_url, config_overrides={**secured_config(), "auth": True})
    wrong_key = "tp-wrong-55e1-SECRETKEY"
    with c:
        async with httpx.AsyncClient(base_url=c.gateway_url, timeout=60) as client:
            h = {**bearer("acme"), "X-Taskplane-Task-Id": f"secret-{uuid.uuid4().hex[:6]}"}
            assert (await client.post("/v1/chat/completions", json=_chat(SECRET_PROMPT), headers=h)).status_code == 200
            r = await client.post("/v1/completions", json={"model": MODEL, "prompt": SECRET_PROMPT, "max_tokens": 4}, headers=h)
            assert r.status_code == 200
            async with client.stream("POST", "/v1/chat/completions", json=_chat(SECRET_PROMPT, stream=True), headers=h) as s:
                await s.aread()
            async with client.stream("POST", "/v1/chat/completions", json=_chat(SECRET_PROMPT * 20, stream=True, max_tokens=200),
                                     headers=h) as s:
                async for _line in s.aiter_lines():
                    break
            bad = [
                ({"model": MODEL, "messages": [{"role": "user", "content": [SECRET_PROMPT]}]}, h),
                ({"model": MODEL, "messages": [{"role": SECRET_PROMPT, "content": SECRET_PROMPT}]}, h),
                (_chat(SECRET_PROMPT * 500), h),
                ({"model": SECRET_PROMPT, "messages": [{"role": "user", "content": SECRET_PROMPT}]}, h),
                (_chat(SECRET_PROMPT), {"Authorization": f"Bearer {wrong_key}"}),
                (_chat(SECRET_PROMPT), {**bearer("acme"), "X-Taskplane-Tenant": "globex"}),
            ]
            for body, headers in bad:
                r = await client.post("/v1/chat/completions", json=body, headers=headers)
                assert 400 <= r.status_code < 500
            r = await client.post("/v1/chat/completions", content=json.dumps(_chat(SECRET_PROMPT))[:-3], headers=h)
            assert r.status_code == 400
            # replica failures: 5xx from one replica, then a killed one
            await client.post(f"{c.replicas[0].url}/admin/faults", json={"error_rate": 1.0})
            for _ in range(4):
                await client.post("/v1/chat/completions", json=_chat(SECRET_PROMPT), headers=h)
            c.kill_replica(1)
            for _ in range(4):
                await client.post("/v1/chat/completions", json=_chat(SECRET_PROMPT), headers=h)
            await client.get("/admin/replicas", headers={"Authorization": f"Bearer {wrong_key}"})
            await client.get("/reports", headers=bearer("acme"))
    log = (tmp_path / "logs" / "gateway.log").read_text(errors="replace")
    assert "replica_marked_down" in log or "replica_unreachable" in log, "the failure paths did log"
    for secret in [SECRET_PROMPT, "TOPSECRET", *KEYS.values(), ADMIN_TOKEN, wrong_key, "SECRETKEY", "SECRETTOKEN"]:
        assert secret not in log, f"{secret!r} leaked into the gateway log"
    assert os.environ["TASKPLANE_LOG_LEVEL"] == "debug"
    cfg = yaml.safe_load((tmp_path / "gateway.yaml").read_text())
    assert "SECRET" not in json.dumps(cfg)


async def test_header_limit_holds_for_a_request_pipelined_behind_another(secure: LocalCluster) -> None:
    """Both requests in one write: h11 parses the second, whole, from its buffer; the limit
    must still hold (the app-level check)."""
    body = json.dumps(_chat("hi")).encode()
    auth_line = f"Authorization: Bearer {KEYS['acme']}\r\n"
    first = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n{auth_line}Content-Type: application/json\r\n"
             f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    second = (f"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Pad: {'p' * 70000}\r\nConnection: close\r\n\r\n").encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", secure.gateway_port)
    writer.write(first + second)
    await writer.drain()
    data = b""
    while True:
        chunk = await asyncio.wait_for(reader.read(65536), timeout=30)
        if not chunk:
            break
        data += chunk
    writer.close()
    assert data.startswith(b"HTTP/1.1 200")
    assert b"HTTP/1.1 431" in data and b"header block exceeds" in data


async def test_metrics_name_tenants_only_to_the_admin(secure: LocalCluster) -> None:
    """On an auth-on gateway /metrics stays scrapeable without a token, but series labelled
    by tenant (their names and spend) need the admin token."""
    async with httpx.AsyncClient(base_url=secure.gateway_url, timeout=30) as client:
        assert (await client.post("/v1/chat/completions", json=_chat("hi"), headers=bearer("acme"))).status_code == 200
        anyone = (await client.get("/metrics")).text
        admin = (await client.get("/metrics", headers=bearer("admin"))).text
        tenant_key = (await client.get("/metrics", headers=bearer("acme"))).text
    assert "taskplane_gateway_requests_total" in anyone
    assert 'tenant="' not in anyone and 'tenant="' not in tenant_key
    assert 'taskplane_gateway_cost_usd_total{tenant="acme"}' in admin
