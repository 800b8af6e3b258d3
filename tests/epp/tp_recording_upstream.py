"""A replica that records what reaches it: each inference request's method, path and
headers, so a test can say a refused call never reached a replica and a served one
arrived without the client's taskplane, ``x-envoy-*`` and ``authorization`` headers. It
answers well: a short SSE stream (with usage and ``[DONE]``) or a unary JSON answer."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

_METRICS = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"
_USAGE = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


def _response(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    return f"HTTP/1.1 {status} OK\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _stream() -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    delta = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "ok"}}]}
    usage = {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": _USAGE}
    return head + _chunk(_event(delta)) + _chunk(_event(usage)) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def _unary() -> bytes:
    body = {"id": "x", "object": "chat.completion", "model": "m", "usage": _USAGE,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
    return _response(200, json.dumps(body).encode())


class RecordingUpstream:
    """Serves on 127.0.0.1:<port> in a background thread; ``seen`` lists the inference
    requests as (method, path, {header: value}), names lower-case."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self) -> RecordingUpstream:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(5)

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        loop.run_forever()
        server.close()
        loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                length = int(headers.get("content-length", "0") or 0)
                body = await reader.readexactly(length) if length else b""
                if path == "/health":
                    writer.write(_response(200, b""))
                elif path == "/metrics":
                    writer.write(_response(200, _METRICS, "text/plain"))
                else:
                    self.seen.append((method, path, headers))
                    stream = bool(body) and json.loads(body).get("stream") is True
                    writer.write(_stream() if stream else _unary())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()
