"""Envoy retries a failed replica on the picker's fallback list before anything streamed
(one row per attempt), and the tenant limit answers 429 with Retry-After."""

from __future__ import annotations

import uuid

import httpx
from tp_epp_helpers import chat, rows_eventually, tp_headers

from taskplane.dev.local import LocalCluster


async def test_tenant_limit_is_429_with_retry_after(door_solo: LocalCluster, pg_url: str) -> None:
    task = f"solo-{uuid.uuid4().hex[:8]}"
    hdrs = {"X-Taskplane-Tenant": "solo", "X-Taskplane-Task-Id": task}
    async with httpx.AsyncClient(base_url=door_solo.gateway_url, timeout=60) as client:
        long_call = chat("a long answer", stream=True, max_tokens=3000)
        async with client.stream("POST", "/v1/chat/completions", json=long_call, headers={**hdrs, "X-Taskplane-Step": "0"}) as held:
            assert held.status_code == 200
            second = await client.post("/v1/chat/completions", json=chat("another"), headers={**hdrs, "X-Taskplane-Step": "1"})
            await held.aclose()
    assert second.status_code == 429, second.text
    assert second.headers["retry-after"] == "1"
    assert second.json()["error"]["type"] == "overloaded"
    got = await rows_eventually(pg_url, task, 2)
    by_step = {r["step"]: r for r in got}
    assert by_step[1]["outcome"] == "shed"
    assert by_step[0]["outcome"] in ("cancelled", "success")  # the client left the long stream
    assert len(got) == 2


async def test_killed_replica_is_retried_on_a_fallback_with_one_row_per_attempt(door_solo: LocalCluster, pg_url: str) -> None:
    task = f"retry-{uuid.uuid4().hex[:8]}"
    session = {"X-Taskplane-Session-Id": task}
    async with httpx.AsyncClient(base_url=door_solo.gateway_url, timeout=30) as client:
        first = await client.post("/v1/chat/completions", json=chat("warm up"), headers=tp_headers(task, 0, **session))
        assert first.status_code == 200
        pinned = first.headers["x-taskplane-replica"]
        index = next(i for i, r in enumerate(door_solo.replicas) if r.name == pinned)
        door_solo.kill_replica(index)  # refused at once: the registry has not noticed yet
        second = await client.post("/v1/chat/completions", json=chat("after the crash"), headers=tp_headers(task, 1, **session))
        third = await client.post("/v1/chat/completions", json=chat("after the crash", stream=True),
                                  headers=tp_headers(task, 2, **session))
    assert second.status_code == 200, second.text
    assert second.headers["x-taskplane-replica"] != pinned
    assert third.status_code == 200 and third.text.rstrip().endswith("[DONE]")
    tries = int(second.headers.get("x-envoy-attempt-count", "1"))
    got = await rows_eventually(pg_url, task, 3 + (tries - 1))
    step1 = [r for r in got if r["step"] == 1]
    assert len({r["attempt_key"] for r in got}) == len(got), "an attempt was written twice"
    assert [r["outcome"] for r in step1 if r["outcome"] == "success"] == ["success"]
    assert len(step1) == tries, f"Envoy made {tries} attempts; rows: {[(r['replica'], r['outcome']) for r in step1]}"
    failed = [r for r in step1 if r["outcome"] != "success"]
    assert all(r["replica"] == pinned for r in failed)
    door_solo.start_replica(door_solo.replicas[index])
