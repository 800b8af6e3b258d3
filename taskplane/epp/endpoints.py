"""Replica names and the ``ip:port`` endpoints the GIE protocol speaks, kept in step
with the registry (Kubernetes discovery, the autoscaler), and fed to Envoy as EDS."""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from taskplane.engines.registry import ReplicaRegistry
from taskplane.epp.envoy_config import endpoint_of, write_endpoints

log = structlog.get_logger(__name__)


class EndpointBook:
    """Which replica listens at which endpoint; ``refresh`` rewrites Envoy's EDS file
    (atomically) whenever the registry's replica set changed."""

    def __init__(self, registry: ReplicaRegistry, eds_file: Path | None = None) -> None:
        self.registry = registry
        self.eds_file = eds_file
        self.by_endpoint: dict[str, str] = {}
        self.by_replica: dict[str, str] = {}
        self._urls: dict[str, str] | None = None  # None: not written yet (an empty pool still needs its file)
        self.unreachable: set[str] = set()  # replicas without an endpoint (yet): never chosen

    def refresh(self) -> bool:
        """Re-read the registry; True when the set changed (and the EDS file was rewritten)."""
        urls = {name: s.config.url for name, s in self.registry.replicas.items()}
        if urls == self._urls:
            return False
        by_replica = {}
        for name, url in urls.items():
            try:
                by_replica[name] = endpoint_of(url)
            except OSError as exc:  # a name that does not resolve yet: left out until it does
                log.warning("endpoint_unresolved", replica=name, url=url, error=str(exc))
        self.by_replica = by_replica
        self.unreachable = set(urls) - set(by_replica)
        self.by_endpoint = {ep: name for name, ep in by_replica.items()}
        self._urls = urls
        if self.eds_file is not None:
            write_endpoints(self.eds_file, list(by_replica.values()))
        log.info("endpoints", endpoints=sorted(self.by_endpoint))
        return True

    def endpoint(self, replica: str) -> str | None:
        return self.by_replica.get(replica)

    def replica(self, endpoint: str | None) -> str | None:
        if not endpoint:
            return None
        return self.by_endpoint.get(endpoint.strip())

    async def follow(self, interval_s: float = 0.5) -> None:
        """Keep Envoy's endpoints in step with the registry until cancelled."""
        while True:
            try:
                self.refresh()
            except OSError as exc:
                log.warning("eds_write_failed", error=str(exc))
            await asyncio.sleep(interval_s)
