"""Faults that clients cause, on a real gateway recording to the real Postgres: a client
that leaves mid-stream or mid-upload, and a flood of idle sockets under a low fd limit.
Each test prints its measurement (the fault matrix in docs/reliability.md quotes them)."""

from __future__ import annotations

import asyncio
import resource
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from taskplane.dev.local import LocalCluster

MODEL = "llama-3.1-8b"


@pytest.fixture(scope="module")
def slow(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Replicas slow enough that a stream lasts seconds; short header deadline."""
    c = LocalCluster(Path(tmp_path_factory.mktemp("clients")), replicas=2, database_url=pg_url, speed=1.0,
                     config_overrides={"limits": {"header_timeout_s": 2.0, "body_timeout_s": 5.0}})
    with c:
        yield c


async def _rows(url: str, task_id: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url.replace("+asyncpg", ""), timeout=5)
    try:
        return list(await conn.fetch("SELECT outcome, completion_tokens, gpu_seconds, total_ms FROM llm_calls "
                                     "WHERE task_id = $1", task_id))
    finally:
        await conn.close()


async def _until_rows(url: str, task_id: str, bound_s: float = 20.0) -> list[asyncpg.Record]:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        rows = await _rows(url, task_id)
        if rows:
            return rows
        await asyncio.sleep(0.2)
    return []


async def _inflight(client: httpx.AsyncClient) -> int:
    return sum(r["inflight"] for r in (await client.get("/admin/replicas")).json()["replicas"])


async def _good_call(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 4,
                                                            "messages": [{"role": "user", "content": "still there?"}]})


async def test_a_client_gone_mid_stream_is_a_cancelled_row_with_its_tokens(slow: LocalCluster, pg_url: str) -> None:
    task = f"gone-{uuid.uuid4().hex[:8]}"
    body = {"model": MODEL, "max_tokens": 400, "stream": True, "messages": [{"role": "user", "content": "tell me a story"}]}
    seen = 0
    async with httpx.AsyncClient(base_url=slow.gateway_url, timeout=30) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers={"X-Taskplane-Task-Id": task}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    seen += 1
                if seen >= 10:
                    break  # leave mid-stream: closing the response closes the connection
        rows = await _until_rows(pg_url, task)
        assert len(rows) == 1, rows
        row = rows[0]
        print(f"\nclient gone mid-stream: row outcome={row['outcome']} completion_tokens={row['completion_tokens']} "
              f"(client saw {seen} events, asked 400) gpu_s={row['gpu_seconds']:.3f}")
        assert row["outcome"] == "cancelled"
        assert seen - 1 <= row["completion_tokens"] < 400
        for _ in range(100):  # the stream settles just after the connection closes
            if not await _inflight(client):
                break
            await asyncio.sleep(0.05)
        assert await _inflight(client) == 0
        assert (await _good_call(client)).status_code == 200


async def test_a_client_gone_mid_upload_leaves_no_traceback(slow: LocalCluster) -> None:
    log = slow.workdir / "logs" / "gateway.log"
    mark = log.stat().st_size
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", slow.gateway_port)) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 5000\r\n\r\n{\"model\": \"llama")
            await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    tail = log.read_bytes()[mark:].decode(errors="replace")
    assert "Traceback" not in tail and "unhandled_error" not in tail, tail[-2000:]
    async with httpx.AsyncClient(base_url=slow.gateway_url, timeout=30) as client:
        assert (await _good_call(client)).status_code == 200
        assert await _inflight(client) == 0


def _raise_own_fd_limit(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


async def test_an_idle_socket_flood_under_a_low_fd_limit(slow: LocalCluster) -> None:
    """1,000 sockets that send nothing at a gateway limited to 256 descriptors: good calls
    are still served, the replicas stay healthy, and the log stays small."""
    assert slow.gateway_pid is not None
    await asyncio.to_thread(subprocess.run, ["prlimit", f"--pid={slow.gateway_pid}", "--nofile=256:256"], check=True)
    _raise_own_fd_limit(1400)
    log = slow.workdir / "logs" / "gateway.log"
    mark = log.stat().st_size
    socks: list[socket.socket] = []
    t0 = time.monotonic()
    try:
        for _ in range(1000):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", slow.gateway_port))
            except BlockingIOError:
                pass
            socks.append(s)
        await asyncio.sleep(1.0)
        async with httpx.AsyncClient(base_url=slow.gateway_url, timeout=60) as client:
            served = []
            for _ in range(5):
                t = time.monotonic()
                r = await _good_call(client)
                served.append((r.status_code, round(time.monotonic() - t, 2)))
            health = (await client.get("/healthz")).json()
            grown = log.stat().st_size - mark
            print(f"\nidle-socket flood (1000 sockets, fd limit 256): good calls {served}, healthy replicas "
                  f"{health['healthy_replicas']}/{health['replicas']}, log grew {grown} bytes in "
                  f"{time.monotonic() - t0:.1f} s")
            assert all(status == 200 for status, _ in served), served
            assert health["healthy_replicas"] == health["replicas"]
            assert grown < 200_000
    finally:
        for s in socks:
            s.close()
