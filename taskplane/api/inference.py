"""The OpenAI routes of the HTTP API: the body read under its limits, then the data
plane's answer, stopped when the client leaves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

import structlog
from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from taskplane.api.errors import error_response, plain_error
from taskplane.api.limits import BodyTimeout, read_capped
from taskplane.api.state import api_state
from taskplane.errors import TaskplaneError

log = structlog.get_logger(__name__)

router = APIRouter()


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


async def answer(kind: str, request: Request) -> Any:
    """One OpenAI request of ``kind``: its body, capped in size and time, to the data plane."""
    state = api_state(request)
    limits = state.config.limits
    try:
        raw = await read_capped(request, limits.max_body_bytes, limits.body_timeout_s)
    except TaskplaneError as exc:
        return error_response(exc)
    except BodyTimeout as exc:
        return plain_error(408, str(exc), headers={"Connection": "close"})
    except ClientDisconnect:
        # The client left mid-upload: nothing was counted, and nobody reads an answer.
        log.info("client_left_mid_upload", path=request.url.path)
        return Response(status_code=499)
    assert state.data_plane is not None
    return await _unless_client_leaves(request, state.data_plane.answer(kind, raw, request.headers))


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Any:
    """OpenAI chat completions, placed by taskplane's scheduler."""
    return await answer("chat", request)


@router.post("/v1/completions")
async def completions(request: Request) -> Any:
    """OpenAI completions, placed by taskplane's scheduler."""
    return await answer("completions", request)


# the Responses API and embeddings (vLLM serves both), placed like chat calls
@router.post("/v1/responses", name="responses")
async def responses(request: Request) -> Any:
    return await answer("responses", request)


@router.post("/v1/embeddings", name="embeddings")
async def embeddings(request: Request) -> Any:
    return await answer("embeddings", request)
