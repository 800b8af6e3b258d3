"""The gateway's HTTP surface (FastAPI): OpenAI endpoints, health, metrics, admin, reports.

Routing only; behaviour lives in ``service.Gateway``. Request bodies are read with a
size cap before parsing, so an oversized or endless upload is refused with 413.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from taskplane.config import GatewayConfig
from taskplane.engines.registry import ReplicaRegistry
from taskplane.errors import ErrorType, TaskplaneError
from taskplane.gateway import auth
from taskplane.gateway.metrics import GatewayMetrics
from taskplane.gateway.service import AttemptSink, Gateway, _error_response

log = structlog.get_logger(__name__)


async def read_capped(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TaskplaneError(ErrorType.PAYLOAD_TOO_LARGE, f"request body of {declared} bytes exceeds the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TaskplaneError(ErrorType.PAYLOAD_TOO_LARGE, f"request body exceeds the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


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
            start_discovery,
            start_kv_subscriptions,
        )

        sink: AttemptSink = await build_sink(config, database_url, outbox_dir)
        placer = placer_factory(registry) if placer_factory else build_placer(config, registry)
        gw = Gateway(config, registry, placer, sink, metrics, build_response_cache(config))
        state["gateway"] = gw
        state["sink"] = sink
        await registry.start()
        subs = await start_kv_subscriptions(config, registry, placer)
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
    app.state.taskplane = state
    app.state.registry = registry

    async def _openai(kind: str, request: Request) -> Any:
        gw: Gateway = state["gateway"]
        try:
            raw = await read_capped(request, config.limits.max_body_bytes)
        except TaskplaneError as exc:
            return _error_response(exc)
        return await gw.handle(kind, raw, request.headers)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        """OpenAI chat completions, placed by taskplane's scheduler."""
        return await _openai("chat", request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        """OpenAI completions, placed by taskplane's scheduler."""
        return await _openai("completions", request)

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
    async def prom() -> Response:
        for s in registry.replicas.values():
            metrics.healthy.labels(replica=s.name).set(1 if s.healthy else 0)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/admin/replicas")
    async def admin_replicas(request: Request) -> Any:
        try:
            auth.check_admin(config, request.headers)
        except TaskplaneError as exc:
            return _error_response(exc)
        out = []
        for s in registry.replicas.values():
            v = s.view()
            out.append({"name": s.name, "url": s.config.url, "model": s.pool.model, "gpu": s.config.gpu,
                        "healthy": v.healthy, "inflight": s.inflight, "num_running": s.num_running,
                        "num_waiting": s.num_waiting, "kv_usage": s.kv_usage, "kv_blocks_total": v.kv_blocks_total,
                        "prefix_cache_hits": s.prefix_hits, "prefix_cache_queries": s.prefix_queries,
                        "kv_events_live": s.kv_events_live, "cost_per_hour_usd": s.price_per_hour})
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
            return _error_response(exc)

    return app
