"""A deliberately dumb HTTP/1.1 client over a raw socket: it sends exactly the bytes a test
asks for (duplicate headers, trailing spaces, lying lengths, garbage), which httpx refuses
to send, and parses the answer with h11. Every read has a deadline, so a gateway that
hangs fails the test instead of hanging it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import h11


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    closed_without_answer: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)


def build_request(
    method: str, path: str, headers: list[tuple[str, str]], body: bytes | None, *, chunked: bool = False,
    host: str = "gateway",
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers]
    if body is not None:
        if chunked:
            lines.append("Transfer-Encoding: chunked")
        else:
            lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    if body is None:
        return head
    if chunked:
        out = bytearray(head)
        for i in range(0, len(body), 8192):
            piece = body[i : i + 8192]
            out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        out += b"0\r\n\r\n"
        return bytes(out)
    return head + body


async def send_raw(port: int, data: bytes, *, timeout: float = 20.0) -> RawResponse:
    """Send ``data`` and read one response (until the server closes or the response ends)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h11.Connection(h11.CLIENT)
    try:
        try:
            writer.write(data)
            await writer.drain()
        except (ConnectionResetError, BrokenPipeError):
            pass  # the server may answer (413, 431) and close before reading everything
        # h11 needs to believe it sent a request before it parses a response.
        conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        conn.send(h11.EndOfMessage())
        status, headers, body = 0, {}, bytearray()
        async with asyncio.timeout(timeout):
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    try:
                        chunk = await reader.read(65536)
                    except ConnectionResetError:
                        chunk = b""
                    conn.receive_data(chunk)
                    if not chunk and status == 0:
                        return RawResponse(0, {}, b"", closed_without_answer=True)
                    continue
                if isinstance(event, h11.Response):
                    status = event.status_code
                    headers = {k.decode().lower(): v.decode("latin-1") for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    return RawResponse(status, headers, bytes(body))
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass
