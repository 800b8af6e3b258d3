"""Replica names and the ``ip:port`` endpoints the GIE protocol speaks, kept in step
with the registry (Kubernetes discovery, the autoscaler), and fed to Envoy as EDS.

The book follows the registry's membership callback, so Envoy learns of a replica the
moment it joins or leaves; a slow poll remains as a safety net for what a callback
cannot fix (a hostname that did not resolve yet, an EDS write that failed)."""

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
        registry.on_membership_change(self._registry_changed)

    def _registry_changed(self) -> None:
        try:
            self.refresh()
        except OSError as exc:  # the safety poll writes it again
            self._urls = None
            log.warning("eds_write_failed", error=str(exc))

    def refresh(self, *, force: bool = False) -> bool:
        """Re-read the registry; True when the set changed (and the EDS file was rewritten).
        ``force``: resolve and write even if no URL changed."""
        urls = {name: s.config.url for name, s in self.registry.replicas.items()}
        if urls == self._urls and not force:
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

    async def follow(self, interval_s: float = 5.0) -> None:
        """Until cancelled, the safety poll behind the membership callback: names that
        did not resolve are tried again, a failed EDS write is repeated."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.refresh(force=bool(self.unreachable))
            except OSError as exc:
                self._urls = None  # written again on the next turn
                log.warning("eds_write_failed", error=str(exc))
