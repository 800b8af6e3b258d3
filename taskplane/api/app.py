"""The HTTP API (FastAPI) beside either data plane: the OpenAI routes (``inference``),
health, metrics, admin and reports (``control``), the contract's error shape for every
refusal, and the lifespan that builds the gateway's ``CallService``.

The Python proxy (``taskplane.gateway``) serves this app to clients; Envoy's front door
(``taskplane.epp``) serves it behind Envoy for everything but the calls, and its picker
drives the very ``CallService`` the lifespan built.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from taskplane.api import control, inference
from taskplane.api.errors import plain_error
from taskplane.api.http11 import MAX_HEADER_BYTES, install_accept_guard
from taskplane.api.limits import HeaderLimit
from taskplane.api.state import ApiState, DataPlaneFactory
from taskplane.calls.metrics import GatewayMetrics
from taskplane.calls.service import CallService
from taskplane.config import GatewayConfig
from taskplane.engines.registry import ReplicaRegistry

log = structlog.get_logger(__name__)


@asynccontextmanager
async def _serving(state: ApiState, outbox_dir: Path | None, data_plane: DataPlaneFactory) -> AsyncIterator[None]:
    """From start to stop: the cost sink, the placer, the ``CallService`` and the data plane
    over it, the rows a killed predecessor left, the registry, KV events and discovery."""
    from taskplane.calls.wiring import (
        build_placer,
        build_response_cache,
        build_sink,
        seed_predictions,
        start_discovery,
        start_kv_subscriptions,
    )

    config, registry = state.config, state.registry
    install_accept_guard(asyncio.get_running_loop())
    sink = await build_sink(config, state.database_url, outbox_dir)
    placer = build_placer(config, registry)
    await seed_predictions(placer, state.database_url)
    calls = CallService(config, registry, placer, sink, state.metrics, build_response_cache(config))
    plane = data_plane(calls)
    state.calls, state.data_plane = calls, plane
    await calls.record_lost_attempts()  # before serving: a predecessor killed mid-attempt
    await registry.start()
    subs = state.kv_subscriptions = await start_kv_subscriptions(config, registry, placer)
    watchers = start_discovery(config, registry, placer, subs)
    from taskplane.engines.lora_loader import start_adapter_loader

    if (loader := start_adapter_loader(registry, placer)) is not None:  # adapter pre-loads (LoRA fleets)
        watchers.append(loader)
    try:
        yield
    finally:
        for w in watchers:
            w.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        await subs.close()
        await registry.close()
        await plane.close()
        close = getattr(sink, "close", None)
        if close is not None:
            await close()


async def _http_error(_req: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return plain_error(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))


async def _validation_error(_req: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return plain_error(400, f"invalid request: {exc.errors()[:3]}")


async def _unexpected(req: Request, exc: Exception) -> JSONResponse:
    # A bug, not bad input: log the type and where (never the body), answer in the
    # contract's shape so clients still get a parseable error.
    log.error("unhandled_error", path=req.url.path, error=type(exc).__name__, detail=str(exc)[:200])
    return JSONResponse({"error": {"type": "internal_error", "message": "internal error in the gateway; see its log"}},
                        status_code=500)


def build_api(config: GatewayConfig, data_plane: DataPlaneFactory, *, database_url: str | None = None,
              outbox_dir: Path | None = None) -> FastAPI:
    """One gateway's HTTP app; ``data_plane`` answers its OpenAI routes."""
    state = ApiState(config=config, registry=ReplicaRegistry(config), metrics=GatewayMetrics(), database_url=database_url)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with _serving(state, outbox_dir, data_plane):
            yield

    app = FastAPI(title="taskplane gateway", version="0.1.0", lifespan=lifespan)
    app.add_middleware(HeaderLimit, limit=MAX_HEADER_BYTES)
    app.state.api = state
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
    app.include_router(inference.router)
    app.include_router(control.router)
    return app
