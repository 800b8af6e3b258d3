"""The scheduler through the gateway, on real simulated replicas: admission order,
saturation, deadlines, fallback moves and the exact response cache."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx

from taskplane.dev.local import LocalCluster

MODEL, SMALL = "llama-3.1-8b", "llama-3.2-1b"


def _body(content: str, max_tokens: int = 8, **kw: object) -> dict[str, object]:
    return {"model": kw.pop("model", MODEL), "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **kw}


async def _metric(client: httpx.AsyncClient, url: str, name: str) -> float:
    text = (await client.get(f"{url}/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def test_critical_call_overtakes_queued_batch_calls(tmp_path: Path) -> None:
    # One replica that runs two calls at a time, slowly: the rest wait in the gateway's admission queue.
    with LocalCluster(tmp_path, replicas=1, max_num_seqs=2, speed=1.0) as c:
        finished: list[str] = []

        async def call(client: httpx.AsyncClient, name: str, priority: str) -> None:
            r = await client.post("/v1/chat/completions", json=_body(f"{name} " * 20, max_tokens=120),
                                  headers={"X-Taskplane-Tenant": "acme", "X-Taskplane-Priority": priority})
            assert r.status_code == 200, r.text
            finished.append(name)

        async with httpx.AsyncClient(base_url=c.gateway_url, timeout=120) as client:
            batch = [asyncio.create_task(call(client, f"batch{i}", "batch")) for i in range(6)]
            await asyncio.sleep(0.5)  # the batch calls are running or queued
            # the held calls are on /metrics (the autoscaler reads them as demand the replicas cannot see)
            held = await _metric(client, c.gateway_url, 'taskplane_gateway_queued_calls{band="batch"')
            assert held >= 3, held
            critical = asyncio.create_task(call(client, "critical", "critical"))
            await asyncio.gather(*batch, critical)
        # Two batch calls were already running when the critical call came; it must run next.
        assert finished.index("critical") <= 3, finished


async def test_unmeetable_budget_is_504_and_fallback_moves_the_call(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, replicas=2, models=[MODEL, SMALL], fallbacks={MODEL: SMALL}) as c:
        async with httpx.AsyncClient(base_url=c.gateway_url, timeout=60) as client:
            r = await client.post("/v1/chat/completions", json=_body("x " * 3000, max_tokens=500),
                                  headers={"X-Taskplane-Tenant": "acme", "X-Taskplane-Budget-Ms": "1"})
            assert r.status_code == 504, r.text
            assert r.json()["error"]["type"] == "deadline_unmeetable"

            # The primary pool is gone; a call that allows fallback is moved to the small model.
            c.kill_replica(0)
            await asyncio.sleep(1.5)
            r = await client.post("/v1/chat/completions", json=_body("summarise this"),
                                  headers={"X-Taskplane-Tenant": "acme", "X-Taskplane-Allow-Fallback": "true"})
            assert r.status_code == 200, r.text
            assert r.headers["X-Taskplane-Model"] == SMALL
            r = await client.post("/v1/chat/completions", json=_body("summarise this"), headers={"X-Taskplane-Tenant": "acme"})
            assert r.status_code == 503, "without allow-fallback the call is not moved"


async def test_response_cache_serves_a_repeated_deterministic_call_without_a_replica(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, replicas=1) as c:
        body = _body(f"deterministic question {uuid.uuid4().hex}", temperature=0)
        async with httpx.AsyncClient(base_url=c.gateway_url, timeout=60) as client:
            first = await client.post("/v1/chat/completions", json=body, headers={"X-Taskplane-Tenant": "acme"})
            assert first.status_code == 200
            served = await _metric(client, c.replicas[0].url, "vllm:e2e_request_latency_seconds_count")
            second = await client.post("/v1/chat/completions", json=body, headers={"X-Taskplane-Tenant": "acme"})
            assert second.status_code == 200
            assert second.headers["X-Taskplane-Replica"] == "response-cache"
            assert second.json()["choices"] == first.json()["choices"]
            assert await _metric(client, c.replicas[0].url, "vllm:e2e_request_latency_seconds_count") == served
            # a sampled call is never served from the cache
            sampled = await client.post("/v1/chat/completions", json={**body, "temperature": 0.7}, headers={"X-Taskplane-Tenant": "acme"})
            assert sampled.headers["X-Taskplane-Replica"] != "response-cache"


async def test_session_moves_off_a_saturated_replica(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, replicas=2, max_num_seqs=2, speed=1.0) as c:
        session = f"s-{uuid.uuid4().hex[:6]}"
        h = {"X-Taskplane-Tenant": "acme", "X-Taskplane-Session-Id": session}
        async with httpx.AsyncClient(base_url=c.gateway_url, timeout=120) as client:
            r = await client.post("/v1/chat/completions", json=_body("session start " * 40), headers=h)
            home = r.headers["X-Taskplane-Replica"]
            # Fill the session's replica with long calls from other sessions, pinned there by affinity.
            other = {"X-Taskplane-Tenant": "acme"}
            home_url = next(x.url for x in c.replicas if x.name == home)
            blockers = [asyncio.create_task(client.post(f"{home_url}/v1/chat/completions", json=_body("block", max_tokens=400), headers=other))
                        for _ in range(4)]
            await asyncio.sleep(1.5)  # the gateway's scrape sees the replica saturated
            r = await client.post("/v1/chat/completions", json=_body("session start " * 40 + "next"), headers=h)
            assert r.status_code == 200
            assert r.headers["X-Taskplane-Replica"] != home, "a saturated replica should not keep the session"
            await asyncio.gather(*blockers)
