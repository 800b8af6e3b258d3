"""Builds the gateway's collaborators from configuration: the placer (scheduler core),
the response cache, the durable cost sink, and the KV-event subscriptions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from taskplane.config import GatewayConfig
from taskplane.engines.registry import ReplicaRegistry
from taskplane.gateway.placement import Placer, SessionAffinityPlacer
from taskplane.gateway.service import AttemptSink

log = structlog.get_logger(__name__)


def build_placer(config: GatewayConfig, registry: ReplicaRegistry) -> Placer:
    return SessionAffinityPlacer(registry)


def build_response_cache(config: GatewayConfig) -> Any | None:
    return None


async def build_sink(config: GatewayConfig, database_url: str | None, outbox_dir: Path | None) -> AttemptSink:
    if not database_url:
        log.warning("no_database", detail="attempt rows are not recorded: set TASKPLANE_DATABASE_URL or database_url")
        return AttemptSink()
    from taskplane.store.writer import CostWriter

    writer = CostWriter(database_url, outbox_dir or Path(".taskplane/outbox-gateway"))
    await writer.start()
    return writer  # type: ignore[return-value]


async def start_kv_subscriptions(config: GatewayConfig, registry: ReplicaRegistry, placer: Placer) -> list[Any]:
    return []
