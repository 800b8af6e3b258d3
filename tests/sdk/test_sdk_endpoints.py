"""/v1/responses and /v1/embeddings through the real gateway to simulated replicas: placed,
answered as vLLM answers, and charged in the llm_calls rows like any call."""

from __future__ import annotations

import uuid

import httpx
from tp_sdk_db import calls as _calls

from taskplane.context import H_TASK, H_TENANT
from taskplane.dev.local import LocalCluster

MODEL = "llama-3.1-8b"


async def test_responses_and_embeddings_through_the_gateway(gw_cluster: LocalCluster, pg_url: str) -> None:
    task = f"endpoints-{uuid.uuid4().hex[:8]}"
    headers = {H_TASK: task, H_TENANT: "acme"}
    async with httpx.AsyncClient(base_url=gw_cluster.gateway_url, trust_env=False, timeout=30) as http:
        r = await http.post("/v1/responses", headers=headers, json={
            "model": MODEL, "input": "Say hi", "instructions": "be brief", "max_output_tokens": 12})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "response" and body["output"][0]["type"] == "message"
        assert body["usage"]["output_tokens"] == 12
        assert r.headers["x-taskplane-replica"] and float(r.headers["x-taskplane-cost-usd"]) > 0

        e = await http.post("/v1/embeddings", headers=headers, json={"model": MODEL, "input": ["a b", "c"]})
        assert e.status_code == 200, e.text
        assert [d["index"] for d in e.json()["data"]] == [0, 1]
        bad = await http.post("/v1/embeddings", headers=headers, json={"model": MODEL})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request"
    rows = await _calls(pg_url, task, 2)
    assert len(rows) == 2 and all(row["outcome"] == "success" and row["cost_usd"] > 0 for row in rows)
    assert sorted(int(row["completion_tokens"]) for row in rows) == [0, 12]
