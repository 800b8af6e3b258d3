"""Builds the gateway's collaborators from configuration: the placer (the scheduler
core), the response cache, the durable cost sink, and the KV-event subscriptions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from taskplane.config import GatewayConfig
from taskplane.engines.registry import ReplicaRegistry
from taskplane.gateway.placement import Placer, ScheduledPlacer
from taskplane.gateway.service import AttemptSink

log = structlog.get_logger(__name__)


def build_placer(config: GatewayConfig, registry: ReplicaRegistry) -> ScheduledPlacer:
    from taskplane.scheduler.policies import build_policy

    scheduler = build_policy(config.scheduler, tenants=config.tenants, pools=config.pools)
    return ScheduledPlacer(scheduler, registry, max_wait_s=config.limits.request_timeout_s)


def build_response_cache(config: GatewayConfig) -> Any | None:
    if config.scheduler.response_cache_entries <= 0:
        return None
    from taskplane.scheduler.response_cache import ResponseCache

    return ResponseCache(config.scheduler.response_cache_entries)


async def build_sink(config: GatewayConfig, database_url: str | None, outbox_dir: Path | None) -> AttemptSink:
    if not database_url:
        log.warning("no_database", detail="attempt rows are not recorded: set TASKPLANE_DATABASE_URL or database_url")
        return AttemptSink()
    from taskplane.store.writer import CostWriter

    writer = CostWriter(database_url, outbox_dir or Path(".taskplane/outbox-gateway"))
    await writer.start()
    return writer  # type: ignore[return-value]


class _Subscriptions:
    """The KV-event subscribers of every replica that publishes events."""

    def __init__(self) -> None:
        self.subs: dict[str, Any] = {}

    async def close(self) -> None:
        for sub in self.subs.values():
            await sub.stop()
        self.subs.clear()


async def start_kv_subscriptions(config: GatewayConfig, registry: ReplicaRegistry, placer: Placer) -> list[Any]:
    """Subscribe to each replica's KV events (replaying from sequence 0 to catch up)."""
    from taskplane.engines.kv_events import KVEventSubscriber

    on_events = getattr(placer, "on_kv_events", None)
    if on_events is None:
        return []
    subs = _Subscriptions()
    for state in registry.replicas.values():
        rc = state.config
        if not rc.kv_events:
            continue
        sub = KVEventSubscriber(state.name, rc.kv_events, on_events, replay_endpoint=rc.kv_replay,
                                on_resync=getattr(placer, "on_resync", None), replay_from=0)
        await sub.start()
        subs.subs[state.name] = sub
    log.info("kv_subscriptions", replicas=sorted(subs.subs))
    return [subs]
