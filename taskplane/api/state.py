"""What the HTTP API's handlers share, kept on ``app.state.api``: the gateway's config,
registry and metrics from the start, the ``CallService`` and the data plane once the app's
lifespan has built them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import FastAPI, Request

from taskplane.calls.metrics import GatewayMetrics
from taskplane.calls.service import CallService
from taskplane.config import GatewayConfig
from taskplane.engines.registry import ReplicaRegistry


class DataPlane(Protocol):
    """What answers the OpenAI routes that reach the HTTP app (the Python proxy relays
    them; on Envoy's front door the picker decides them before they could get here)."""

    async def answer(self, kind: str, raw: bytes, headers: Mapping[str, str]) -> Any:
        """The response to one OpenAI request of ``kind`` with body ``raw``."""

    async def close(self) -> None:
        """Let go of what the data plane holds (its upstream connections)."""


#: Builds the data plane over the app's ``CallService`` once the lifespan has it.
DataPlaneFactory = Callable[[CallService], DataPlane]


@dataclass
class ApiState:
    config: GatewayConfig
    registry: ReplicaRegistry
    metrics: GatewayMetrics
    database_url: str | None
    calls: CallService | None = None  # None until the lifespan built it: /healthz answers 503 "starting"
    kv_subscriptions: Any = None
    data_plane: DataPlane | None = None


def api_state(request: Request) -> ApiState:
    """The state of the app that serves ``request``."""
    state: ApiState = request.app.state.api
    return state


def call_service(app: FastAPI) -> CallService:
    """The app's ``CallService``, once its lifespan has started."""
    calls = app.state.api.calls
    assert calls is not None, "the app's lifespan has not started"
    return calls  # type: ignore[no-any-return]
