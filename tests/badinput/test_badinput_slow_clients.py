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
    try:
        return await trickle_on(reader, writer, data, delay_s=delay_s, give_up_s=give_up_s)
    finally:
        writer.close()


async def trickle_on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes, *,
                     delay_s: float, give_up_s: float) -> tuple[float, bytes]:
    """``trickle`` on a connection that is already open."""
    t0 = time.monotonic()
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
        elapsed = time.monotonic() - t0
        return elapsed, answer + await rest_of_answer(reader)
    finally:
        read_task.cancel()


async def rest_of_answer(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> bytes:
    """What the server still sends until it closes (a server may write the head and the
    body of its answer apart)."""
    rest = b""
    try:
        while more := await asyncio.wait_for(reader.read(65536), timeout=timeout_s):
            rest += more
    except (TimeoutError, ConnectionError):
        pass
    return rest


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



@pytest.fixture(scope="module", params=["envoy", "python"])
def guarded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Every data plane: Envoy (its header deadline, its upload route's body deadline) and
    the Python proxy (its HTTP layer and body reader) answer slow clients alike."""
    c = LocalCluster(Path(tmp_path_factory.mktemp(f"badinput-slow-{request.param}")), replicas=2,
                     config_overrides=auth_config(), data_plane=request.param)
    c.__enter__()
    try:
        yield c
    finally:
        c.__exit__(None, None, None)


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


async def test_body_trickled_after_whole_headers_gets_the_body_408(guarded: LocalCluster) -> None:
    """The headers arrive at once, the body one byte every 250 ms: cut at the 3 s body
    deadline (not at the stream's idle timeout, which each byte resets), with the body's
    own message; other clients are served meanwhile."""
    body = json.dumps(GOOD).encode()
    request = build_request("POST", "/v1/chat/completions", [("Authorization", f"Bearer {KEYS['acme']}"),
                                                             ("Content-Type", "application/json")], body)
    head = request[: -len(body)]

    async def loris() -> tuple[float, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", guarded.gateway_port)
        writer.write(head)
        await writer.drain()
        try:
            elapsed, answer = await trickle_on(reader, writer, body, delay_s=0.25, give_up_s=20)
        finally:
            writer.close()
        return elapsed, answer

    lorises = [asyncio.ensure_future(loris()) for _ in range(10)]
    good = await _good_calls_meanwhile(guarded.gateway_url, 5)
    for elapsed, answer in await asyncio.gather(*lorises):
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b'"invalid_request"' in answer and b"request body not received within 3 s" in answer, answer[-300:]
        assert 2.9 <= elapsed < 10, f"the body deadline is 3 s, answered after {elapsed:.1f} s"
    assert max(good) < 2.0, f"good calls slowed down by slow clients: {good}"


async def test_stalled_body_after_headers_is_closed(guarded: LocalCluster) -> None:
    """Headers promise 1000 bytes, 10 arrive, then nothing: 408 within the deadline."""
    head = build_request("POST", "/v1/chat/completions", [("Authorization", f"Bearer {KEYS['acme']}")], b"x" * 1000)
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded.gateway_port)
    t0 = time.monotonic()
    writer.write(head[: len(head) - 990])
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(65536), timeout=15)
    elapsed = time.monotonic() - t0
    answer += await rest_of_answer(reader)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408") and elapsed < 10
    assert b"request body not received within 3 s" in answer, answer[-300:]


async def test_idle_connection_that_sends_nothing_is_not_held_for_ever(guarded: LocalCluster) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded.gateway_port)
    writer.write(b"POST /v1/chat")  # a partial request line, then silence
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(65536), timeout=15)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408")


@pytest.mark.parametrize("data_plane", ["envoy", "python"])
async def test_a_call_held_by_admission_is_not_cut_by_the_body_deadline(tmp_path: Path, data_plane: str) -> None:
    """The body deadline bounds the upload only: calls that arrived whole and then wait in
    admission longer than it (one replica running two at a time, slowly) are all served.
    (Envoy's connection-manager request_timeout would have cut them: it runs until the
    picker lets the request go.)"""
    overrides = auth_config(body_timeout_s=1.0)
    with LocalCluster(tmp_path, replicas=1, max_num_seqs=2, speed=1.0, config_overrides=overrides,
                      data_plane=data_plane) as c:
        async with httpx.AsyncClient(base_url=c.gateway_url, timeout=120) as client:
            async def call(i: int) -> httpx.Response:
                body = {**GOOD, "messages": [{"role": "user", "content": f"held {i} " * 20}], "max_tokens": 120}
                return await client.post("/v1/chat/completions", json=body,
                                         headers={"Authorization": f"Bearer {KEYS['acme']}"})
            answers = await asyncio.gather(*(call(i) for i in range(6)))
    assert [r.status_code for r in answers] == [200] * 6, [r.text[:200] for r in answers if r.status_code != 200]
    queued_ms = [float(r.headers["x-taskplane-queue-ms"]) for r in answers]
    assert max(queued_ms) > 1000.0, f"no call was held past the 1 s body deadline: {queued_ms}"
