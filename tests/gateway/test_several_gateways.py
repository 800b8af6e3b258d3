"""Gateways hold no shared mutable state: each follows every replica's KV events, so two
gateways place one session's calls on the same replica, and a session survives the
loss of one gateway."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx

from taskplane.dev import processes as proc
from taskplane.dev.local import LocalCluster

MODEL = "llama-3.1-8b"


async def test_two_gateways_agree_on_a_session_and_survive_losing_one(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, replicas=4) as c:
        second, second_pid = c.add_gateway()
        gateways = [c.gateway_url, second]
        session = f"s-{uuid.uuid4().hex[:8]}"
        history = [{"role": "system", "content": "You are a meticulous agent with a long shared prompt. " * 30}]
        seen = []
        async with httpx.AsyncClient(timeout=30) as client:
            for step in range(6):
                history.append({"role": "user", "content": f"tool output {step}: " + "result " * 40})
                gw = gateways[step % 2]  # alternate gateways: neither has seen the other's routing
                r = await client.post(f"{gw}/v1/chat/completions",
                                      json={"model": MODEL, "messages": history, "max_tokens": 8},
                                      headers={"X-Taskplane-Tenant": "acme", "X-Taskplane-Session-Id": session})
                assert r.status_code == 200, r.text
                seen.append(r.headers["X-Taskplane-Replica"])
                history.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
                await asyncio.sleep(0.3)  # the agent's tool-call gap; KV events reach every gateway meanwhile
            assert len(set(seen)) == 1, f"the session moved between replicas: {seen}"

            proc.stop_pid(second_pid)  # lose one gateway; the session carries on through the other
            history.append({"role": "user", "content": "one more step"})
            r = await client.post(f"{c.gateway_url}/v1/chat/completions",
                                  json={"model": MODEL, "messages": history, "max_tokens": 8},
                                  headers={"X-Taskplane-Tenant": "acme", "X-Taskplane-Session-Id": session})
            assert r.status_code == 200
            assert r.headers["X-Taskplane-Replica"] == seen[0]
            assert int(r.headers["X-Taskplane-Cached-Tokens"]) > 0
