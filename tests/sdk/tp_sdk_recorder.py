"""A tiny OpenAI-shaped HTTP endpoint that records request headers.

Used ONLY to assert which taskplane headers a call carried (the gateway and the sim
engine do not echo them). It answers like a replica behind a gateway: a chat/completion
body with ``usage`` and the gateway's X-Taskplane-* response headers, so the SDK's cost
accounting sees a real HTTP response. ``fail_next`` queues error responses.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float = 0.0


@dataclass
class Recorder:
    cost_per_call: float = 0.001
    calls: list[Recorded] = field(default_factory=list)
    failures: list[tuple[int, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def fail_next(self, status: int, error_type: str, *, headers: dict[str, str] | None = None, times: int = 1) -> None:
        with self.lock:
            for _ in range(times):
                self.failures.append((status, {"error": {"type": error_type, "message": "injected"}}, headers or {}))

    def reset(self) -> None:
        with self.lock:
            self.calls.clear()
            self.failures.clear()

    def for_task(self, task_id: str) -> list[Recorded]:
        with self.lock:
            return [c for c in self.calls if c.headers.get("x-taskplane-task-id") == task_id]

    def start(self) -> Recorder:
        rec = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                headers = {k.lower(): v for k, v in self.headers.items()}
                with rec.lock:
                    rec.calls.append(Recorded(self.path, headers, body, time.monotonic()))
                    failure = rec.failures.pop(0) if rec.failures else None
                if failure is not None:
                    status, payload, extra = failure
                    self._send(status, payload, extra)
                    return
                text = f"reply to step {headers.get('x-taskplane-step')}"
                if self.path.endswith("/chat/completions"):
                    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                else:
                    choice = {"index": 0, "text": text, "finish_reason": "stop"}
                payload = {
                    "id": "cmpl-rec", "object": "chat.completion", "model": body.get("model"),
                    "choices": [choice], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }
                self._send(200, payload, {
                    "X-Taskplane-Replica": "recorder-0", "X-Taskplane-Gpu": "h100",
                    "X-Taskplane-Cost-Usd": f"{rec.cost_per_call:.8f}", "X-Taskplane-Cached-Tokens": "0",
                    "X-Taskplane-Queue-Ms": "0", "X-Taskplane-Model": str(body.get("model")),
                })

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
