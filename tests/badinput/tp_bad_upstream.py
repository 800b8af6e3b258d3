"""A tiny misbehaving "replica" for the bad-upstream tests: healthy on /health and
/metrics, broken on inference. The last user message picks the breakage (``mode:NAME``),
so one server covers every case. Raw asyncio streams, so it can send exactly the broken
bytes a real engine or a dying proxy might."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

METRICS = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"


def _response(status: int, body: bytes, ctype: str = "application/json", length: int | None = None) -> bytes:
    head = f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {len(body) if length is None else length}\r\n\r\n"
    return head.encode() + body


def _sse_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _delta(text: str) -> bytes:
    obj = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


MODES = ("garbage", "not-openai", "json-list", "usage-not-object", "usage-bad-counts", "html-500", "truncated-body", "close-at-once",
         "stream-truncated", "stream-garbage-then-close", "stream-hang", "hang", "stream-error-event", "stream-ends-early")


class BadUpstream:
    """Serves on 127.0.0.1:<port> in a background thread; ``hits`` counts inference requests."""

    def __init__(self, port: int, *, fine: bool = False) -> None:
        self.port = port
        self.fine = fine  # a healthy replica beside the broken ones: answers every call well
        self.hits: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self) -> BadUpstream:
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
        asyncio.set_event_loop(loop)  # the teardown's gather needs it as this thread's loop
        self._server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        loop.run_forever()
        self._server.close()
        tasks = asyncio.all_tasks(loop)
        for t in tasks:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = next((int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length:")), 0)
                body = await reader.readexactly(length) if length else b""
                if path == "/health":
                    writer.write(_response(200, b""))
                elif path == "/metrics":
                    writer.write(_response(200, METRICS, "text/plain"))
                else:
                    if not await self._inference(json.loads(body), writer):
                        return
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _inference(self, req: dict[str, Any], w: asyncio.StreamWriter) -> bool:
        """Answer one inference request badly; False closes the connection."""
        mode = str(req["messages"][-1]["content"]).removeprefix("mode:")
        self.hits[mode] = self.hits.get(mode, 0) + 1
        if self.fine:
            body = {"id": "x", "object": "chat.completion", "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}
            w.write(_response(200, json.dumps(body).encode()))
        elif mode == "garbage":
            w.write(_response(200, b"this is not json at all"))
        elif mode == "not-openai":
            w.write(_response(200, b'{"hello": "world"}'))
        elif mode == "json-list":
            w.write(_response(200, b"[1, 2, 3]"))
        elif mode == "usage-not-object":
            w.write(_response(200, b'{"choices": [], "usage": "lots"}'))
        elif mode == "usage-bad-counts":  # a served answer whose token counts are nonsense
            body = {"id": "x", "object": "chat.completion", "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": "lots", "completion_tokens": -3,
                              "prompt_tokens_details": {"cached_tokens": 1.5}}}
            w.write(_response(200, json.dumps(body).encode()))
        elif mode == "html-500":
            w.write(_response(500, b"<html><body>Internal Server Error</body></html>", "text/html"))
        elif mode == "truncated-body":
            w.write(_response(200, b'{"choices": [{"mess', length=1000))
            await w.drain()
            return False
        elif mode == "close-at-once":
            return False
        elif mode == "stream-truncated":
            w.write(_sse_head() + _chunk(_delta("Hel")) + _chunk(_delta("lo")))
            await w.drain()
            return False
        elif mode == "stream-garbage-then-close":
            w.write(_sse_head() + _chunk(b"data: {{{{ not json\n\n") + _chunk(b"\x00\xff\xfe garbage\n\n"))
            await w.drain()
            return False
        elif mode == "stream-error-event":
            err = b'data: {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}\n\n'
            w.write(_sse_head() + _chunk(_delta("a")) + _chunk(err) + b"0\r\n\r\n")
        elif mode == "stream-ends-early":  # a clean end of the body, but no [DONE]
            w.write(_sse_head() + _chunk(_delta("a")) + _chunk(_delta("b")) + b"0\r\n\r\n")
        elif mode == "stream-hang":
            w.write(_sse_head() + _chunk(_delta("a")))
            await w.drain()
            await asyncio.sleep(3600)
        elif mode == "hang":
            await asyncio.sleep(3600)
        return True
