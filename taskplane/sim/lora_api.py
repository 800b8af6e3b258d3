"""vLLM's LoRA endpoints and metric on the simulated replica (``--enable-lora``).

- ``POST /v1/load_lora_adapter`` ``{"lora_name": ..., "lora_path": ...}`` and ``POST
  /v1/unload_lora_adapter`` ``{"lora_name": ...}``: registered, as in vLLM, only when
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` is true; they answer vLLM's plain-text success lines
  and its error messages (400 for an adapter already loaded, 404 for an unknown one).
- ``GET /v1/models`` lists each adapter with the base model as its ``parent``
  (:func:`model_cards`); a request names an adapter as its ``model``.
- ``vllm:lora_requests_info``: a gauge whose labels name the adapters of the running and
  waiting requests and ``max_lora``; its value is the time of the reading, as in vLLM.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import PlainTextResponse
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from taskplane.sim.lora import Adapters, LoraError
from taskplane.sim.openai_api import ApiError

RUNTIME_UPDATES_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def runtime_updates_allowed() -> bool:
    return os.environ.get(RUNTIME_UPDATES_ENV, "").strip().lower() in ("1", "true")


def model_cards(adapters: Adapters | None, base: str, max_model_len: int, created: int) -> list[dict[str, Any]]:
    """The ``/v1/models`` entries of the adapters, after the base model's."""
    if adapters is None:
        return []
    return [{"id": a.name, "object": "model", "created": created, "owned_by": "vllm", "root": a.path,
             "parent": base, "max_model_len": max_model_len} for a in adapters.registered.values()]


class LoraCollector(Collector):
    """``vllm:lora_requests_info`` as vLLM exports it."""

    def __init__(self, rep: Any) -> None:
        self.rep = rep

    def collect(self) -> Iterable[Any]:
        adapters: Adapters | None = self.rep.engine.adapters
        if adapters is None:
            return
        waiting = sorted({r.spec.adapter for r in self.rep.engine.batcher.waiting if r.spec.adapter})
        g = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                              labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"])
        g.add_metric([str(adapters.settings.max_loras), ",".join(waiting), ",".join(sorted(adapters.running))],
                     time.time())
        yield g


def attach_router(app: FastAPI, rep: Any) -> None:
    """Add the runtime LoRA endpoints for ``rep`` (a replica started with ``--enable-lora``)."""
    router = APIRouter()
    adapters: Adapters = rep.engine.adapters

    async def body_of(request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError as exc:
            raise ApiError(400, f"Invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        return body

    @router.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> PlainTextResponse:
        body = await body_of(request)
        name, path = str(body.get("lora_name") or ""), str(body.get("lora_path") or "")
        try:
            adapters.register(name, path)
        except LoraError as exc:
            raise ApiError(exc.status, str(exc)) from exc
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @router.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> PlainTextResponse:
        body = await body_of(request)
        name = str(body.get("lora_name") or "")
        try:
            adapters.unregister(name)
        except LoraError as exc:
            raise ApiError(exc.status, str(exc)) from exc
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    app.include_router(router)
