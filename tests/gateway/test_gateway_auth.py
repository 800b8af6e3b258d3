"""Auth on (the default outside `taskplane dev`): the worker's HTTP client carries the
tenant's API key from TASKPLANE_API_KEY, and the tenant comes from the key, not from a
header the caller could forge."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from taskplane.dev.local import LocalCluster
from workflows.activities import http_client

KEY = "tp-test-key-acme"


async def test_worker_client_sends_the_tenant_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tenants = [{"id": "acme", "api_key_sha256": hashlib.sha256(KEY.encode()).hexdigest(), "max_priority": "interactive"}]
    with LocalCluster(tmp_path, replicas=1, config_overrides={"auth": True, "tenants": tenants}) as c:
        body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        monkeypatch.delenv("TASKPLANE_API_KEY", raising=False)
        async with http_client() as anonymous:
            r = await anonymous.post(f"{c.gateway_url}/v1/chat/completions", json=body)
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "unauthorized"
        monkeypatch.setenv("TASKPLANE_API_KEY", KEY)
        async with http_client() as keyed:
            r = await keyed.post(f"{c.gateway_url}/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            # a tenant header that contradicts the key is refused, never honoured
            r = await keyed.post(f"{c.gateway_url}/v1/chat/completions", json=body,
                                 headers={"X-Taskplane-Tenant": "someone-else"})
            assert r.status_code == 403
            # the key's tenant caps priority
            r = await keyed.post(f"{c.gateway_url}/v1/chat/completions", json=body, headers={"X-Taskplane-Priority": "critical"})
            assert r.status_code == 403
