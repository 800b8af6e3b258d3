"""The HTTP API's own routes, whichever data plane carries the calls: ``/v1/models``,
``/healthz``, ``/metrics`` (Prometheus), ``/admin/replicas`` and ``/reports``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY

from taskplane.api.errors import error_response
from taskplane.api.state import ApiState, api_state
from taskplane.calls import auth
from taskplane.calls.metrics import exposition
from taskplane.engines.replica import ReplicaState
from taskplane.errors import ErrorType, TaskplaneError

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    config = api_state(request).config
    data = [{"id": pool.model, "object": "model", "owned_by": "taskplane", "max_model_len": pool.max_context_tokens}
            for pool in config.pools]
    return {"object": "list", "data": data}


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    state = api_state(request)
    healthy = sum(1 for s in state.registry.replicas.values() if s.healthy)
    status = 200 if state.calls is not None else 503
    return JSONResponse({"status": "ok" if status == 200 else "starting", "replicas": len(state.registry.replicas),
                         "healthy_replicas": healthy}, status_code=status)


def _is_admin(state: ApiState, request: Request) -> bool:
    try:
        auth.check_admin(state.config, request.headers)
    except TaskplaneError:
        return False
    return True


@router.get("/metrics")
async def prom(request: Request) -> Response:
    """Prometheus metrics; on an auth-on gateway, tenant-labelled series need the admin token."""
    state = api_state(request)
    metrics = state.metrics
    for s in state.registry.replicas.values():
        metrics.healthy.labels(replica=s.name).set(1 if s.healthy else 0)
    metrics.queued.clear()
    assert state.calls is not None
    for model, bands in state.calls.placer.queue_depths().items():
        for band, n in bands.items():
            metrics.queued.labels(model=model, band=band).set(n)
    # The gateway's own metrics, then the process-wide ones (the scheduler's plugins, KV index).
    return Response(exposition([metrics.registry, REGISTRY], tenants=_is_admin(state, request)),
                    media_type=CONTENT_TYPE_LATEST)


def _kv_view(state: ApiState, name: str) -> dict[str, Any]:
    """What the gateway believes about a replica's KV cache: the event stream's position
    and gap/replay counters, and the blocks its index holds (to check recovery after faults)."""
    out: dict[str, Any] = {}
    sub = getattr(state.kv_subscriptions, "subs", {}).get(name)
    if sub is not None:
        out["kv_events_last_seq"] = sub.last_seq
        out["kv_events_stats"] = dict(sub.stats)
    index = getattr(getattr(getattr(state.calls, "placer", None), "scheduler", None), "kv_index", None)
    precise = getattr(index, "precise", None)
    if precise is not None:
        try:
            out["kv_index_blocks"] = len(precise.blocks_of(name))
            out["kv_index_in_sync"] = bool(precise.in_sync(name))
        except Exception:  # the index's shape is the scheduler's business; this view is best effort
            pass
    return out


def _replica_view(state: ApiState, s: ReplicaState) -> dict[str, Any]:
    v = s.view()
    return {"name": s.name, "url": s.config.url, "model": s.pool.model, "gpu": s.config.gpu,
            "healthy": v.healthy, "inflight": s.inflight, "num_running": s.num_running,
            "num_waiting": s.num_waiting, "kv_usage": s.kv_usage, "kv_blocks_total": v.kv_blocks_total,
            "prefix_cache_hits": s.prefix_hits, "prefix_cache_queries": s.prefix_queries,
            "kv_events_live": s.kv_events_live, "cost_per_hour_usd": s.price_per_hour,
            "sleeping": s.sleeping, "max_loras": s.max_loras, "lora_running": sorted(s.lora_running),
            "lora_served": None if s.lora_served is None else sorted(s.lora_served),
            "role": s.config.role,
            **_kv_view(state, s.name)}


@router.get("/admin/replicas")
async def admin_replicas(request: Request) -> Any:
    state = api_state(request)
    try:
        auth.check_admin(state.config, request.headers)
    except TaskplaneError as exc:
        return error_response(exc)
    return {"replicas": [_replica_view(state, s) for s in state.registry.replicas.values()]}


@router.get("/reports", response_class=HTMLResponse)
async def reports(request: Request) -> Any:
    """The HTML cost report; all tenants with the admin token, else the caller's own tenant."""
    state = api_state(request)
    try:
        tenant: str | None = None
        try:
            auth.check_admin(state.config, request.headers)
        except TaskplaneError:
            tenant = auth.authenticate(state.config, request.headers)
            if tenant is None:
                raise
        if state.database_url is None:
            raise TaskplaneError(ErrorType.NO_REPLICA, "this gateway has no database configured")
        from taskplane.reports.command import html_report

        return HTMLResponse(await html_report(state.database_url, tenant=tenant))
    except TaskplaneError as exc:
        return error_response(exc)
