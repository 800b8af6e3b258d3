"""Slow-loris clients: bodies and headers trickled byte by byte. The gateway answers 408
(JSON) and closes within its deadlines (3 s here), never hangs, and keeps serving others
at full speed meanwhile."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tp_badinput_env import KEYS, auth_config
from tp_rawhttp import build_request

from taskplane.dev.local import LocalCluster

GOOD = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "quick one"}], "max_tokens": 4}


async def trickle(port: int, data: bytes, *, delay_s: float, give_up_s: float) -> tuple[float, bytes]:
    """Send ``data`` one byte every ``delay_s`` until the server answers or closes; return
    (seconds until the server answered or closed, what it sent)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.monotonic()
    answer = b""
    read_task = asyncio.ensure_future(reader.read(65536))
    try:
        for i in range(len(data)):
            if read_task.done() or time.monotonic() - t0 > give_up_s:
                break
            try:
                writer.write(data[i : i + 1])
                await writer.drain()
            except (ConnectionResetError, BrokenPipeError):
                break
            await asyncio.sleep(delay_s)
        answer = await asyncio.wait_for(read_task, timeout=max(0.1, give_up_s - (time.monotonic() - t0)))
        return time.monotonic() - t0, answer
    finally:
        read_task.cancel()
        writer.close()


async def _good_calls_meanwhile(url: str, n: int) -> list[float]:
    latencies = []
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        for _ in range(n):
            t0 = time.monotonic()
            r = await client.post("/v1/chat/completions", json=GOOD, headers={"Authorization": f"Bearer {KEYS['acme']}"})
            assert r.status_code == 200, r.text
            latencies.append(time.monotonic() - t0)
            await asyncio.sleep(0.2)
    return latencies



@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The Python data plane: Envoy's front door has no per-body deadline that spares calls
    held by admission (its request_timeout also runs while the picker holds a call), so the
    408-within-the-body-deadline cases are the Python proxy's (docs/benchmarks.md, data plane)."""
    c = LocalCluster(Path(tmp_path_factory.mktemp("badinput-slow")), replicas=2, config_overrides=auth_config(),
                     data_plane="python")
    with c:
        yield c


async def test_trickled_body_gets_408_and_others_are_served(guarded: LocalCluster) -> None:
    body = json.dumps(GOOD).encode()
    head = build_request("POST", "/v1/chat/completions", [("Authorization", f"Bearer {KEYS['acme']}"),
                                                          ("Content-Type", "application/json")], body)[: -len(body)]
    loris = [asyncio.ensure_future(trickle(guarded.gateway_port, head + body, delay_s=0.25, give_up_s=20)) for _ in range(20)]
    good = await _good_calls_meanwhile(guarded.gateway_url, 10)
    results = await asyncio.gather(*loris)
    for elapsed, answer in results:
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"invalid_request"' in answer and b"not received within" in answer
        assert elapsed < 10, "the body deadline is 3 s"
    assert max(good) < 2.0, f"good calls slowed down by slow clients: {good}"


async def test_trickled_headers_get_408_and_close(guarded: LocalCluster) -> None:
    data = build_request("POST", "/v1/chat/completions", [("Authorization", f"Bearer {KEYS['acme']}")],
                         json.dumps(GOOD).encode())
    loris = [asyncio.ensure_future(trickle(guarded.gateway_port, data, delay_s=0.25, give_up_s=20)) for _ in range(20)]
    good = await _good_calls_meanwhile(guarded.gateway_url, 10)
    for elapsed, answer in await asyncio.gather(*loris):
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"request headers not received" in answer
        assert elapsed < 10
    assert max(good) < 2.0


async def test_stalled_body_after_headers_is_closed(guarded: LocalCluster) -> None:
    """Headers promise 1000 bytes, 10 arrive, then nothing: 408 within the deadline."""
    head = build_request("POST", "/v1/chat/completions", [("Authorization", f"Bearer {KEYS['acme']}")], b"x" * 1000)
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded.gateway_port)
    t0 = time.monotonic()
    writer.write(head[: len(head) - 990])
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(65536), timeout=15)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 10


async def test_idle_connection_that_sends_nothing_is_not_held_for_ever(guarded: LocalCluster) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded.gateway_port)
    writer.write(b"POST /v1/chat")  # a partial request line, then silence
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(65536), timeout=15)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408")
