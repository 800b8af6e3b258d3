"""``taskplane pd-sidecar``: a small proxy in front of a decode replica, as llm-d's routing
sidecar is, that runs a disaggregated call's prefill on the replica the picker named.

A call whose request carries ``x-prefiller-host-port`` (set by the endpoint picker, or the
Python gateway, when the scheduler disaggregated it) goes first to that prefill replica, with
vLLM's NixlConnector request ``kv_transfer_params: {"do_remote_decode": true}``, ``max_tokens``
1 and no streaming; the prefill replica answers with the ``kv_transfer_params`` naming its
blocks, and the original request goes to the local decode engine carrying them (the engine
pulls the blocks and skips their prefill). A stream from the decode engine passes through as
it comes. Without the header the request goes to the decode engine unchanged, and every
other path (``/metrics``, ``/health``, ``/v1/models``, the admin routes) is forwarded as is,
so the picker scrapes the decode engine through its sidecar.

A prefiller that answers ``kv_transfer_params: null`` runs a connector with a shared store
(vLLM's ExampleConnector, LMCache): the original request goes to the decode engine, which
loads the prompt's KV from that store. A prefill that fails (the prefiller unreachable, an
error status, a malformed answer) never loses the call: it is logged (``pd_prefill_failed``), counted,
and the decode engine prefills the prompt itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from taskplane.calls.disagg import PREFILLER_HEADER

log = structlog.get_logger(__name__)

#: Calls that can be disaggregated (vLLM's NixlConnector serves both).
PD_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
#: Not forwarded either way (hop by hop, or recomputed by httpx / uvicorn).
_HOP = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer",
                  "upgrade", "proxy-connection", PREFILLER_HEADER})
#: What the prefill request asks of the prefill replica (llm-d's sidecar sends the same).
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


@dataclass
class SidecarStats:
    """What the sidecar did (``GET /pd-sidecar/stats``): its own counts, not the engine's."""

    disaggregated: int = 0  # prefilled remotely, then decoded here with the returned params
    prefill_failed: int = 0  # the prefiller failed: decoded and prefilled here
    forwarded: int = 0  # requests without the header, passed through
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"disaggregated": self.disaggregated, "prefill_failed": self.prefill_failed,
                "forwarded": self.forwarded, "last_error": self.last_error}


@dataclass
class PdSidecar:
    """The proxy: one decode engine behind it, prefill replicas named per request."""

    decoder_url: str
    prefill_timeout_s: float = 300.0
    stats: SidecarStats = field(default_factory=SidecarStats)
    client: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(
        timeout=httpx.Timeout(10.0, read=None), limits=httpx.Limits(keepalive_expiry=4.0)))

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        prefiller = request.headers.get(PREFILLER_HEADER)
        if request.method == "POST" and request.url.path in PD_PATHS and prefiller:
            body = await self._prefill(request.url.path, body, prefiller)
        elif request.url.path in PD_PATHS:
            self.stats.forwarded += 1
        return await self._forward(request, body)

    async def _prefill(self, path: str, raw: bytes, prefiller: str) -> bytes:
        """The decode request's body: the original with the prefill's ``kv_transfer_params``,
        or the original itself when the prefill failed (the engine prefills locally)."""
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                return raw  # the engine answers the malformed request itself
            params = await self._run_prefill(path, body, _host_port(prefiller))
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            self.stats.prefill_failed += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("pd_prefill_failed", prefiller=prefiller, error=self.stats.last_error,
                        fallback="local prefill")
            return raw
        self.stats.disaggregated += 1
        if params is None:  # a shared-store connector: the decode engine finds the blocks itself
            return raw
        return json.dumps({**body, "kv_transfer_params": params}).encode()

    async def _run_prefill(self, path: str, body: dict[str, Any], host_port: str) -> dict[str, Any] | None:
        req = {**body, "kv_transfer_params": dict(PREFILL_PARAMS), "max_tokens": 1, "stream": False}
        req.pop("stream_options", None)
        if "max_completion_tokens" in req:
            req["max_completion_tokens"] = 1
        resp = await self.client.post(f"http://{host_port}{path}", json=req, timeout=self.prefill_timeout_s)
        if resp.status_code != 200:
            raise ValueError(f"the prefiller answered {resp.status_code}: {resp.text[:200]}")
        params = resp.json().get("kv_transfer_params")
        if params is None:
            # vLLM's connectors that write to a store both sides read (ExampleConnector, LMCache)
            # answer null: the decode engine loads the prompt's KV from the store by itself
            log.info("pd_prefill_no_params", prefiller=host_port)
            return None
        if not isinstance(params, dict):
            raise KeyError(f"the prefiller's kv_transfer_params is no object: {params!r}")
        return params

    async def _forward(self, request: Request, body: bytes) -> Response:
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        url = self.decoder_url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        req = self.client.build_request(request.method, url, headers=headers, content=body)
        try:
            resp = await self.client.send(req, stream=True)
        except httpx.HTTPError as exc:
            log.warning("pd_decoder_unreachable", url=url, error=str(exc))
            return JSONResponse({"error": {"type": "no_replica", "message": f"the decode engine is unreachable: {exc}"}},
                                status_code=502)
        out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}  # raw bytes: encoding kept
        return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code, headers=out,
                                 background=BackgroundTask(resp.aclose))


def _host_port(value: str) -> str:
    """The header's ``host:port``, checked (a bad one is a failed prefill, not a bad call)."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in host:
        raise ValueError(f"{PREFILLER_HEADER} must be host:port, got {value!r}")
    return f"{host}:{int(port)}"


def create_app(sidecar: PdSidecar) -> Starlette:
    """The sidecar's ASGI app: its stats, and everything else proxied."""

    async def stats(_: Request) -> Response:
        return JSONResponse(sidecar.stats.as_dict())

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
    return Starlette(routes=[Route("/pd-sidecar/stats", stats, methods=["GET"]),
                             Route("/{path:path}", sidecar.handle, methods=methods)])
