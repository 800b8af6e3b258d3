"""Plain-HTTP GETs of the replicas' ``/metrics`` and ``/health``, every second, cheaply.

Why not httpx: the registry scrapes every replica twice a second on the picker's event
loop, and an httpx GET costs about 0.8 ms of CPU (anyio, httpcore, h11 and their
per-request objects) for a 7 KB page: with three replicas that was most of the idle
picker's CPU, and at agent rates (~25 calls/s) it is part of every call's share. These
GETs need none of httpx's features: HTTP/1.1 on a kept-alive connection, a status and a
body (``Content-Length``, chunked, or to the close). ``https://`` URLs are not handled
here (``plain`` says which URLs are); the registry keeps httpx for them.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from urllib.parse import urlsplit

_MAX_HEAD = 64 << 10
_MAX_BODY = 16 << 20


class ProbeConnectError(ConnectionError):
    """The replica refused (or could not be reached for) a new connection."""


class ProbeProtocolError(OSError):
    """The answer was not HTTP/1.x as expected (the connection is dropped)."""


@dataclass(frozen=True, slots=True)
class Page:
    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise ProbeProtocolError(f"HTTP {self.status_code}")


def plain(url: str) -> bool:
    """Whether ``HttpProbe`` can fetch ``url`` (``http://`` only)."""
    return url.startswith("http://")


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class HttpProbe:
    """GETs over kept-alive connections, a few idle ones kept per host."""

    def __init__(self, *, timeout_s: float = 2.0, connect_timeout_s: float = 1.0, keep: int = 2) -> None:
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.keep = keep
        self._idle: dict[tuple[str, int], list[_Conn]] = {}

    async def get(self, url: str) -> Page:
        """GET ``url`` (``http://`` only); raises ``ProbeConnectError`` when a new connection
        fails, ``TimeoutError`` after ``timeout_s``, ``OSError`` otherwise."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not a plain http URL: {url!r}")
        host, port = parts.hostname, parts.port or 80
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        request = f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: */*\r\n\r\n".encode("latin-1")
        async with asyncio.timeout(self.timeout_s):
            idle = self._idle.setdefault((host, port), [])
            while idle:  # a kept-alive connection the replica may have closed meanwhile: one try each
                conn = idle.pop()
                try:
                    return await self._exchange(conn, request, idle)
                except (OSError, asyncio.IncompleteReadError):
                    conn.close()
                except BaseException:
                    conn.close()
                    raise
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), self.connect_timeout_s)
            except TimeoutError:
                raise  # a connect timeout may be overload, not a replica gone (as httpx's ConnectTimeout)
            except OSError as exc:
                raise ProbeConnectError(f"{host}:{port}: {exc}") from exc
            conn = _Conn(reader, writer)
            try:
                return await self._exchange(conn, request, idle)
            except asyncio.IncompleteReadError as exc:
                conn.close()
                raise ProbeProtocolError(f"{host}:{port} closed the connection mid-answer") from exc
            except BaseException:
                conn.close()
                raise

    async def _exchange(self, conn: _Conn, request: bytes, idle: list[_Conn]) -> Page:
        conn.writer.write(request)
        await conn.writer.drain()
        try:
            head = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError as exc:
            raise ProbeProtocolError("answer head too long") from exc
        if len(head) > _MAX_HEAD:
            raise ProbeProtocolError("answer head too long")
        lines = head.decode("latin-1").split("\r\n")
        status_line = lines[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or not status_line[1].isdigit():
            raise ProbeProtocolError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        keep_alive = headers.get("connection", "").lower() != "close" and status_line[0] != "HTTP/1.0"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = await self._chunked(conn.reader)
        elif (length := headers.get("content-length")) is not None:
            if not length.isdigit() or int(length) > _MAX_BODY:
                raise ProbeProtocolError(f"bad content-length {length!r}")
            body = await conn.reader.readexactly(int(length))
        else:
            body, keep_alive = await conn.reader.read(_MAX_BODY), False
        if keep_alive and len(idle) < self.keep:
            idle.append(conn)
        else:
            conn.close()
        return Page(int(status_line[1]), body)

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader) -> bytes:
        out = bytearray()
        while True:
            size_line = (await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError as exc:
                raise ProbeProtocolError(f"bad chunk size {size_line[:20]!r}") from exc
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the blank line
                    pass
                return bytes(out)
            if len(out) + size > _MAX_BODY:
                raise ProbeProtocolError("answer too long")
            out += await reader.readexactly(size)
            await reader.readexactly(2)

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
