"""Builds the gateway's collaborators from configuration: the placer (the scheduler
core), the response cache, the durable cost sink, and the KV-event subscriptions."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import structlog

from taskplane.calls.attempts import AttemptSink
from taskplane.calls.placement import Placer, ScheduledPlacer
from taskplane.config import GatewayConfig, PoolConfig, ReplicaConfig
from taskplane.engines.registry import ReplicaRegistry
from taskplane.engines.replica import ReplicaState

log = structlog.get_logger(__name__)


def build_placer(config: GatewayConfig, registry: ReplicaRegistry) -> ScheduledPlacer:
    from taskplane.scheduler.policies import build_policy

    scheduler = build_policy(config.scheduler, tenants=config.tenants, pools=config.pools)
    hold = {p.model: p.hold_when_empty_s for p in config.pools if p.hold_when_empty_s > 0}
    return ScheduledPlacer(scheduler, registry, max_wait_s=config.limits.request_timeout_s, hold_when_empty=hold)


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


async def seed_predictions(placer: Any, database_url: str | None) -> int:
    """Teach the scheduler's prediction layer the store's recent task history, so it
    predicts from the first call after a restart; 0 without a database or when it is away."""
    pipeline = getattr(getattr(placer, "scheduler", None), "pipeline", None)
    predictor = getattr(getattr(pipeline, "handle", None), "predictor", None)
    if not database_url or predictor is None:
        return 0
    from taskplane.store import db
    from taskplane.store.predict_history import seed_predictor

    engine = db.create_engine(database_url)
    try:
        n = await seed_predictor(predictor, engine)
    except Exception as exc:  # Postgres away: learn from the live stream alone
        log.warning("prediction_history_failed", error=str(exc)[:200])
        return 0
    finally:
        await engine.dispose()
    log.info("prediction_history_loaded", tasks=n)
    return n


class Subscriptions:
    """The KV-event subscribers of every replica that publishes events, kept in step
    with the fleet as replicas join and leave."""

    def __init__(self, placer: Placer) -> None:
        self.placer = placer
        self.subs: dict[str, Any] = {}

    async def add(self, state: ReplicaState) -> None:
        from taskplane.engines.kv_events import KVEventSubscriber

        on_events = getattr(self.placer, "on_kv_events", None)
        rc = state.config
        if on_events is None or not rc.kv_events or state.name in self.subs:
            return
        sub = KVEventSubscriber(state.name, rc.kv_events, on_events, replay_endpoint=rc.kv_replay,
                                on_resync=getattr(self.placer, "on_resync", None), replay_from=0)
        await sub.start()
        self.subs[state.name] = sub

    async def remove(self, name: str) -> None:
        sub = self.subs.pop(name, None)
        if sub is not None:
            await sub.stop()

    async def close(self) -> None:
        for name in list(self.subs):
            await self.remove(name)


async def start_kv_subscriptions(config: GatewayConfig, registry: ReplicaRegistry, placer: Placer) -> Subscriptions:
    """Subscribe to each replica's KV events (replaying from sequence 0 to catch up)."""
    subs = Subscriptions(placer)
    for state in list(registry.replicas.values()):
        await subs.add(state)
    log.info("kv_subscriptions", replicas=sorted(subs.subs))
    return subs


def start_discovery(config: GatewayConfig, registry: ReplicaRegistry, placer: Placer, subs: Subscriptions) -> list[asyncio.Task[None]]:
    """For pools configured with ``discovery:``, follow Kubernetes endpoints: replicas
    join and leave the registry, the scheduler and the KV subscriptions without a restart."""
    from taskplane.engines.discovery import watch
    from taskplane.engines.file_discovery import watch_file

    tasks: list[asyncio.Task[None]] = []
    for pool in config.pools:
        if pool.discovery is None:
            continue

        async def on_change(replicas: list[ReplicaConfig], pool: PoolConfig = pool) -> None:
            added, removed = registry.set_pool_replicas(pool, replicas)
            for name in removed:
                placer.replica_removed(name)
                await subs.remove(name)
            for name in added:
                state = registry.replicas[name]
                await registry.scrape(state)
                await subs.add(state)
            if added or removed:
                log.info("replicas_changed", pool=pool.model, added=added, removed=removed)

        follow = watch_file if pool.discovery.source == "file" else watch
        tasks.append(asyncio.create_task(follow(pool, on_change), name=f"discovery:{pool.model}"))
    return tasks
