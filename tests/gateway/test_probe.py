"""The scrape's lean HTTP GET, against real sockets: bodies by length, chunked and to the
close; kept-alive connections reused, and replaced when the server dropped them; a
refused connection and a silent server told apart (gone, or maybe only overloaded)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from taskplane.engines.probe import HttpProbe, ProbeConnectError, ProbeProtocolError, plain
from taskplane.ports import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def _serve(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server on a free port: its base URL, and the count of connections it accepted."""
    accepted: list[int] = [0]

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        server.close()


async def _requests(reader: asyncio.StreamReader) -> AsyncIterator[str]:
    """The paths of the requests on one connection, until the client closes it."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        yield head.decode().split(" ")[1]


async def _keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    async for path in _requests(reader):
        body = f"page {path}".encode()
        if path == "/chunked":
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"5\r\npage \r\n8;ext=1\r\n/chunked\r\n0\r\nx-trailer: 1\r\n\r\n")
        elif path == "/missing":
            writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()


async def test_bodies_and_reuse() -> None:
    probe = HttpProbe()
    async with _serve(_keep_alive) as (url, accepted):
        assert (await probe.get(f"{url}/metrics")).text == "page /metrics"
        assert (await probe.get(f"{url}/chunked")).text == "page /chunked"
        missing = await probe.get(f"{url}/missing")
        assert missing.status_code == 404
        with pytest.raises(ProbeProtocolError):
            missing.raise_for_status()
        assert accepted[0] == 1  # one kept-alive connection for the three
        pages = await asyncio.gather(probe.get(f"{url}/metrics"), probe.get(f"{url}/health"))
        assert [p.text for p in pages] == ["page /metrics", "page /health"]
        assert accepted[0] == 2  # two at once: a second connection
    await probe.aclose()


async def test_dropped_connections_and_bodies_to_the_close() -> None:
    async def once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async for _path in _requests(reader):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
            return  # keep-alive promised, then the connection dropped (an idle timeout)

    probe = HttpProbe()
    async with _serve(once_then_close) as (url, accepted):
        for _ in range(3):
            assert (await probe.get(f"{url}/metrics")).text == "ok"
            await asyncio.sleep(0.05)  # the server's close reaches the kept connection
        assert accepted[0] == 3  # each reuse failed and was replaced; the caller saw none of it

    async def no_length(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async for _path in _requests(reader):
            writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil the close")
            await writer.drain()
            return

    async with _serve(no_length) as (url, accepted):
        assert (await probe.get(f"{url}/metrics")).text == "until the close"
        assert (await probe.get(f"{url}/metrics")).text == "until the close"
        assert accepted[0] == 2  # not kept: the body ended with the connection
    await probe.aclose()


async def test_refused_silent_and_junk_are_told_apart() -> None:
    probe = HttpProbe(timeout_s=0.3, connect_timeout_s=0.2)
    with pytest.raises(ProbeConnectError):
        await probe.get(f"http://127.0.0.1:{free_port()}/metrics")

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    async with _serve(silent) as (url, _accepted):
        with pytest.raises(TimeoutError) as err:
            await probe.get(f"{url}/metrics")
        assert not isinstance(err.value, ProbeConnectError)  # maybe overloaded, not gone

    async def junk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async for _path in _requests(reader):
            writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
            await writer.drain()

    async with _serve(junk) as (url, _accepted):
        with pytest.raises(ProbeProtocolError):
            await probe.get(f"{url}/metrics")
    await probe.aclose()


def test_plain_http_only() -> None:
    assert plain("http://10.0.0.1:8000/metrics")
    assert not plain("https://replica.example/metrics")
