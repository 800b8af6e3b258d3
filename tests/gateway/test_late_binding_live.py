"""Late binding on the live plane: the gateway holds a call while the only replica has more
than ``max_prefill_backlog_ms`` of prefill committed, and releases it once that drains."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from taskplane.dev.local import LocalCluster

MODEL = "llama-3.1-8b"


async def _metric(client: httpx.AsyncClient, url: str, name: str) -> float:
    text = (await client.get(f"{url}/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def test_a_call_waits_in_the_gateway_while_the_replica_prefills_a_long_prompt(tmp_path: Path) -> None:
    # an L40S: the latency model's prior prefills ~4,500 tokens/s, so a 7,000-token prompt
    # in flight is ~1.5 s of committed prefill, past the default 1,000 ms
    with LocalCluster(tmp_path, replicas=1, gpus=["l40s"], speed=1.0, kv_blocks=8192) as c:
        async with httpx.AsyncClient(base_url=c.gateway_url, timeout=120) as client:
            name = "taskplane_scheduler_backlog_held_total"
            before = await _metric(client, c.gateway_url, name)
            long_prompt = {"model": MODEL, "max_tokens": 4,
                           "messages": [{"role": "user", "content": "lorem ipsum dolor " * 390}]}
            short = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
            t0 = time.monotonic()
            first = asyncio.create_task(client.post("/v1/chat/completions", json=long_prompt))
            for _ in range(1000):  # until the long prompt is placed and prefilling (~7,000 tokens)
                if first.done() or await _metric(client, c.gateway_url, "taskplane_gateway_inflight"):
                    break
                await asyncio.sleep(0.01)
            r2 = await client.post("/v1/chat/completions", json=short)
            r1 = await first
            assert r1.status_code == 200, r1.text
            assert r2.status_code == 200, r2.text
            held = await _metric(client, c.gateway_url, name) - before
            print(f"held {held:.0f}, long call {time.monotonic() - t0:.2f} s")
            assert held >= 1  # the short call waited in flow control, not in the replica's queue
