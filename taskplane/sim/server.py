"""The simulated vLLM replica over HTTP (``taskplane sim-engine``).

Speaks what a vLLM OpenAI server speaks: ``/v1/chat/completions`` and
``/v1/completions`` (with SSE streaming), ``/v1/models``, ``/health``, ``/metrics``
with vLLM's metric names, ``/reset_prefix_cache``, and KV-cache events over ZMQ; with
``--enable-sleep-mode``, vLLM's ``/sleep``, ``/wake_up`` and ``/is_sleeping`` (taskplane/sim/sleep.py).
Plus ``GET/POST /admin/faults`` (fault injection) and ``GET /admin/state``.

Each route is a small handler of its own; the replica it serves (engine, clock, calls in
flight: :class:`~taskplane.sim.http_replica.SimReplica`) is the app's ``state.replica``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from taskplane.engines.keepalive import REPLICA_KEEP_ALIVE_S
from taskplane.errors import UserError
from taskplane.sim import responses
from taskplane.sim.faults import apply_updates
from taskplane.sim.http_replica import ReplicaOptions, SimReplica
from taskplane.sim.kv_transfer import KVTransferConfig, transfer_params
from taskplane.sim.kv_transfer import attach_router as attach_kv_router
from taskplane.sim.lora_api import attach_router as attach_lora_router
from taskplane.sim.lora_api import model_cards, runtime_updates_allowed
from taskplane.sim.openai_api import (
    ApiError,
    chat_prompt,
    check_length,
    completion_prompt,
    error_response,
    require_model,
    validate_sampling,
)
from taskplane.sim.requests import Finished
from taskplane.sim.sleep import attach_router as attach_sleep_router
from taskplane.sim.streaming import SimCall, completion_body, stream

log = structlog.get_logger(__name__)


def create_app(rep: SimReplica) -> FastAPI:
    """The app serving ``rep``; the replica's driver runs for the app's lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await rep.start()
        try:
            yield
        finally:
            await rep.stop()

    app = FastAPI(title="taskplane sim-engine", lifespan=lifespan)
    app.state.replica = rep
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/responses", responses_api, methods=["POST"])
    app.add_api_route("/v1/embeddings", embeddings, methods=["POST"])
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    app.add_api_route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"])
    if rep.sleep is not None:
        attach_sleep_router(app, rep)
    if rep.engine.adapters is not None and runtime_updates_allowed():
        attach_lora_router(app, rep)
    if rep.kv_connector is not None:
        attach_kv_router(app, rep)
    app.add_api_route("/admin/faults", get_faults, methods=["GET"])
    app.add_api_route("/admin/faults", set_faults, methods=["POST"])
    app.add_api_route("/admin/state", state, methods=["GET"])
    return app


def _replica(request: Request) -> SimReplica:
    rep: SimReplica = request.app.state.replica
    return rep


async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.param)


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    return body


async def _hang_if_needed(rep: SimReplica, *, inference: bool = True) -> None:
    if rep.faults.hang or (inference and rep.faults.stall):
        await asyncio.Event().wait()


async def _run(rep: SimReplica, body: dict[str, Any], chat: bool) -> tuple[SimCall, Finished | None]:
    """Validate, apply faults, put the call on the engine; await it unless it streams."""
    adapter = require_model(rep.model, body, rep.adapter_names())
    validate_sampling(body)
    prompt = chat_prompt(body) if chat else completion_prompt(body)
    check_length(rep.max_model_len, len(prompt), body)
    await _hang_if_needed(rep)
    rep.check_faults_on_request()
    arrived = time.monotonic()
    conn, kv_params = rep.kv_connector, transfer_params(body)
    if conn is not None and conn.config.consumes and kv_params.get("do_remote_prefill"):
        await conn.pull(rep, kv_params, len(prompt))  # a failed pull leaves the prompt to be recomputed here
    await rep.until_awake()
    call, sim = rep.make_call(prompt, body, bool(body.get("stream", False)), chat=chat, adapter=adapter)
    call.arrival_wall = arrived  # a call held while the replica slept counts the wait in its TTFT, as in vLLM
    rep.submit(call, sim)
    if call.stream:
        return call, None
    try:
        fin = await call.done
    except asyncio.CancelledError:
        rep.abort(call)
        raise
    if fin.error is not None:
        raise ApiError(500, f"Request failed: {fin.error}")
    if conn is not None and conn.config.produces and kv_params.get("do_remote_decode"):
        call.extra["kv_transfer_params"] = conn.keep(rep, prompt, call.req_id)
    return call, fin


async def _serve(request: Request, chat: bool) -> Response:
    rep = _replica(request)
    body = await _json(request)
    call, fin = await _run(rep, body, chat)
    created = int(time.time())
    cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    if fin is None:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
        return StreamingResponse(stream(call, chat=chat, cid=cid, created=created, model=str(body["model"]),
                                        include_usage=include_usage, abort=rep.abort),
                                 media_type="text/event-stream")
    out = completion_body(call, fin, chat=chat, cid=cid, created=created, model=str(body["model"]))
    if "kv_transfer_params" in call.extra:
        out["kv_transfer_params"] = call.extra["kv_transfer_params"]
    return JSONResponse(out)


async def chat_completions(request: Request) -> Response:
    return await _serve(request, chat=True)


async def completions(request: Request) -> Response:
    return await _serve(request, chat=False)


async def responses_api(request: Request) -> Response:
    """The Responses API, served through the chat path (tools, text.format honoured)."""
    rep = _replica(request)
    body = await _json(request)
    call, fin = await _run(rep, responses.responses_to_chat(body), chat=True)
    assert fin is not None
    chat = completion_body(call, fin, chat=True, cid="chatcmpl-" + uuid.uuid4().hex,
                           created=int(time.time()), model=rep.model)
    return JSONResponse(responses.chat_to_response(chat, body))


async def embeddings(request: Request) -> Response:
    """Embeddings: a prefill-only engine request per input, seeded unit vectors."""
    rep = _replica(request)
    body = await _json(request)
    require_model(rep.model, body)
    inputs = responses.embedding_inputs(body)
    for toks in inputs:
        check_length(rep.max_model_len, len(toks), {})
    await _hang_if_needed(rep)
    rep.check_faults_on_request()
    await rep.until_awake()
    out = responses.embeddings_body(body, inputs, rep.model, rep.seed)
    waits = []
    for toks in inputs:
        call, sim = rep.make_call(toks, {"max_tokens": 1}, False, chat=False)
        rep.submit(call, sim)
        waits.append(call)
    try:
        finished = [await c.done for c in waits]
    except asyncio.CancelledError:
        for c in waits:
            rep.abort(c)
        raise
    if any(f.error is not None for f in finished):
        raise ApiError(500, "Request failed: the engine lost an embedding request")
    return JSONResponse(out)


async def models(request: Request) -> dict[str, Any]:
    rep = _replica(request)
    created = int(time.time())
    return {"object": "list", "data": [{
        "id": rep.model, "object": "model", "created": created, "owned_by": "vllm",
        "root": rep.model, "parent": None, "max_model_len": rep.max_model_len},
        *model_cards(rep.engine.adapters, rep.model, rep.max_model_len, created)]}


async def health(request: Request) -> Response:
    await _hang_if_needed(_replica(request), inference=False)
    return Response(status_code=200)


async def metrics(request: Request) -> Response:
    return Response(generate_latest(_replica(request).registry), media_type=CONTENT_TYPE_LATEST)


async def reset_prefix_cache(request: Request) -> Response:
    rep = _replica(request)
    ok = rep.engine.clear_prefix_cache(rep.vnow())
    rep.wake()
    if not ok:
        raise ApiError(500, "Failed to reset prefix cache: blocks are in use.")
    return Response(status_code=200)


async def get_faults(request: Request) -> dict[str, Any]:
    return _replica(request).faults.as_dict()


async def set_faults(request: Request) -> dict[str, Any]:
    rep = _replica(request)
    body = await _json(request)
    try:
        actions = apply_updates(rep.faults, body)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, str(exc)) from None
    rep.engine.slow_factor = rep.faults.slow
    if "restart_empty" in actions:
        rep.restart_empty()
    if "crash" in actions:
        log.warning("sim_fault_crash")
        asyncio.get_running_loop().call_later(0.05, os._exit, 1)
    rep.wake()
    return {**rep.faults.as_dict(), "actions": actions}


async def state(request: Request) -> dict[str, Any]:
    return _replica(request).state()


def serve(options: ReplicaOptions, *, port: int) -> None:
    """Run one simulated replica until interrupted (``taskplane sim-engine``);
    ``TASKPLANE_SIM_MAX_MODEL_LEN`` sets the context length the options leave open."""
    import uvicorn

    if options.kv_transfer_config is not None:
        try:
            KVTransferConfig.parse(options.kv_transfer_config)
        except ValueError as exc:
            raise UserError(f"--kv-transfer-config: {exc}") from None
    env_len = os.environ.get("TASKPLANE_SIM_MAX_MODEL_LEN")
    if options.max_model_len is None and env_len:
        options = replace(options, max_model_len=int(env_len))
    uvicorn.run(create_app(SimReplica(replace(options, port=port))), host=options.host, port=port, log_level="warning",
                access_log=False, timeout_graceful_shutdown=2, timeout_keep_alive=REPLICA_KEEP_ALIVE_S)
