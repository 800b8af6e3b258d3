"""The gateway's HTTP surface (FastAPI): OpenAI endpoints, health, metrics, admin, reports.

Routing only; behaviour lives in ``service.Gateway``. Request bodies are read with a
size cap before parsing, so an oversized or endless upload is refused with 413.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from taskplane.config import GatewayConfig
from taskplane.engines.registry import ReplicaRegistry
from taskplane.errors import ErrorType, TaskplaneError
from taskplane.gateway import auth
from taskplane.gateway.attempts import AttemptSink
from taskplane.gateway.http11 import MAX_HEADER_BYTES, install_accept_guard
from taskplane.gateway.metrics import GatewayMetrics, exposition
from taskplane.gateway.service import Gateway, error_response

log = structlog.get_logger(__name__)


class BodyTimeout(Exception):
    """The client did not finish sending its body in time (a slow or stalled upload)."""


async def read_capped(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The request body, refused once it passes ``limit`` bytes or ``timeout_s`` seconds, so
    an oversized, endless or trickling upload cannot hold a request open for ever."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TaskplaneError(ErrorType.PAYLOAD_TOO_LARGE, f"request body of {declared} bytes exceeds the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise TaskplaneError(ErrorType.PAYLOAD_TOO_LARGE, f"request body exceeds the {limit}-byte limit")
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(f"request body not received within {timeout_s:g} s ({size} bytes arrived)") from None
    return b"".join(chunks)


class HeaderLimit:
    """Refuse a request whose header block is over ``limit`` bytes (431). The HTTP layer
    already refuses one that arrives in pieces; a block that arrives whole behind another
    request on a kept-alive connection reaches the app, and is refused here."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and sum(len(k) + len(v) + 4 for k, v in scope["headers"]) > self.limit:
            resp = _plain_error(431, f"request header block exceeds the {self.limit}-byte limit",
                                headers={"Connection": "close"})
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _plain_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """DESIGN.md's error body for statuses outside the gateway's own vocabulary (404 route, 405, 408)."""
    return JSONResponse({"error": {"type": str(ErrorType.INVALID_REQUEST), "message": message}}, status_code=status,
                        headers=headers)


def _kv_view(state: dict[str, Any], name: str) -> dict[str, Any]:
    """What the gateway believes about a replica's KV cache: the event stream's position
    and gap/replay counters, and the blocks its index holds (to check recovery after faults)."""
    out: dict[str, Any] = {}
    sub = getattr(state.get("kv_subscriptions"), "subs", {}).get(name)
    if sub is not None:
        out["kv_events_last_seq"] = sub.last_seq
        out["kv_events_stats"] = dict(sub.stats)
    gw = state.get("gateway")
    index = getattr(getattr(getattr(gw, "placer", None), "scheduler", None), "kv_index", None)
    precise = getattr(index, "precise", None)
    if precise is not None:
        try:
            out["kv_index_blocks"] = len(precise.blocks_of(name))
            out["kv_index_in_sync"] = bool(precise.in_sync(name))
        except Exception:  # the index's shape is the scheduler's business; this view is best effort
            pass
    return out


async def _unless_client_leaves(request: Request, work: Coroutine[Any, Any, Any], poll_s: float = 0.5) -> Any:
    """Run the call, but stop it when the client disconnects (an activity that timed out):
    the upstream request is closed so the engine stops spending GPU on an answer nobody
    reads, and the attempt is recorded as cancelled."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=poll_s)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return Response(status_code=499)


def build_app(
    config: GatewayConfig,
    *,
    database_url: str | None = None,
    outbox_dir: Path | None = None,
    placer_factory: Any | None = None,
) -> FastAPI:
    """Assemble registry, scheduler, cost writer and routes for one gateway."""
    metrics = GatewayMetrics()
    registry = ReplicaRegistry(config)
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from taskplane.gateway.wiring import (
            build_placer,
            build_response_cache,
            build_sink,
            seed_predictions,
            start_discovery,
            start_kv_subscriptions,
        )

        install_accept_guard(asyncio.get_running_loop())
        sink: AttemptSink = await build_sink(config, database_url, outbox_dir)
        placer = placer_factory(registry) if placer_factory else build_placer(config, registry)
        await seed_predictions(placer, database_url)
        gw = Gateway(config, registry, placer, sink, metrics, build_response_cache(config))
        state["gateway"] = gw
        state["sink"] = sink
        await gw.record_lost_attempts()  # before serving: a predecessor killed mid-attempt
        await registry.start()
        subs = await start_kv_subscriptions(config, registry, placer)
        state["kv_subscriptions"] = subs
        watchers = start_discovery(config, registry, placer, subs)
        try:
            yield
        finally:
            for w in watchers:
                w.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            await subs.close()
            await registry.close()
            await gw.close()
            close = getattr(sink, "close", None)
            if close is not None:
                await close()

    app = FastAPI(title="taskplane gateway", version="0.1.0", lifespan=lifespan)
    app.add_middleware(HeaderLimit, limit=MAX_HEADER_BYTES)
    app.state.taskplane = state
    app.state.registry = registry

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _plain_error(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return _plain_error(400, f"invalid request: {exc.errors()[:3]}")

    @app.exception_handler(Exception)
    async def _unexpected(req: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: log the type and where (never the body), answer in the
        # contract's shape so clients still get a parseable error.
        log.error("unhandled_error", path=req.url.path, error=type(exc).__name__, detail=str(exc)[:200])
        return JSONResponse({"error": {"type": "internal_error", "message": "internal error in the gateway; see its log"}},
                            status_code=500)

    async def _openai(kind: str, request: Request) -> Any:
        gw: Gateway = state["gateway"]
        try:
            raw = await read_capped(request, config.limits.max_body_bytes, config.limits.body_timeout_s)
        except TaskplaneError as exc:
            return error_response(exc)
        except BodyTimeout as exc:
            return _plain_error(408, str(exc), headers={"Connection": "close"})
        except ClientDisconnect:
            # The client left mid-upload: nothing was counted, and nobody reads an answer.
            log.info("client_left_mid_upload", path=request.url.path)
            return Response(status_code=499)
        return await _unless_client_leaves(request, gw.handle(kind, raw, request.headers))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        """OpenAI chat completions, placed by taskplane's scheduler."""
        return await _openai("chat", request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        """OpenAI completions, placed by taskplane's scheduler."""
        return await _openai("completions", request)

    def _endpoint(kind: str) -> Any:
        async def endpoint(request: Request) -> Any:
            return await _openai(kind, request)
        return endpoint

    # the Responses API and embeddings (vLLM serves both), placed like chat calls
    for path, kind in (("/v1/responses", "responses"), ("/v1/embeddings", "embeddings")):
        app.post(path, name=kind)(_endpoint(kind))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = []
        for pool in config.pools:
            data.append({"id": pool.model, "object": "model", "owned_by": "taskplane", "max_model_len": pool.max_context_tokens})
            if pool.fallback and not config.pool_for(pool.fallback):
                continue
        return {"object": "list", "data": data}

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        healthy = sum(1 for s in registry.replicas.values() if s.healthy)
        status = 200 if "gateway" in state else 503
        return JSONResponse({"status": "ok" if status == 200 else "starting", "replicas": len(registry.replicas),
                             "healthy_replicas": healthy}, status_code=status)

    @app.get("/metrics")
    async def prom(request: Request) -> Response:
        """Prometheus metrics; on an auth-on gateway, tenant-labelled series need the admin token."""
        for s in registry.replicas.values():
            metrics.healthy.labels(replica=s.name).set(1 if s.healthy else 0)
        metrics.queued.clear()
        for model, bands in state["gateway"].placer.queue_depths().items():
            for band, n in bands.items():
                metrics.queued.labels(model=model, band=band).set(n)
        try:
            auth.check_admin(config, request.headers)
            tenants = True
        except TaskplaneError:
            tenants = False
        # The gateway's own metrics, then the process-wide ones (the scheduler's plugins, KV index).
        return Response(exposition([metrics.registry, REGISTRY], tenants=tenants), media_type=CONTENT_TYPE_LATEST)

    @app.get("/admin/replicas")
    async def admin_replicas(request: Request) -> Any:
        try:
            auth.check_admin(config, request.headers)
        except TaskplaneError as exc:
            return error_response(exc)
        out = []
        for s in registry.replicas.values():
            v = s.view()
            out.append({"name": s.name, "url": s.config.url, "model": s.pool.model, "gpu": s.config.gpu,
                        "healthy": v.healthy, "inflight": s.inflight, "num_running": s.num_running,
                        "num_waiting": s.num_waiting, "kv_usage": s.kv_usage, "kv_blocks_total": v.kv_blocks_total,
                        "prefix_cache_hits": s.prefix_hits, "prefix_cache_queries": s.prefix_queries,
                        "kv_events_live": s.kv_events_live, "cost_per_hour_usd": s.price_per_hour,
                        "sleeping": s.sleeping,
                        **_kv_view(state, s.name)})
        return {"replicas": out}

    @app.get("/reports", response_class=HTMLResponse)
    async def reports(request: Request) -> Any:
        """The HTML cost report; all tenants with the admin token, else the caller's own tenant."""
        try:
            tenant: str | None = None
            try:
                auth.check_admin(config, request.headers)
            except TaskplaneError:
                tenant = auth.authenticate(config, request.headers)
                if tenant is None:
                    raise
            if database_url is None:
                raise TaskplaneError(ErrorType.NO_REPLICA, "this gateway has no database configured")
            from taskplane.reports.command import html_report

            return HTMLResponse(await html_report(database_url, tenant=tenant))
        except TaskplaneError as exc:
            return error_response(exc)

    return app
