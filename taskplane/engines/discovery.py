"""Replica discovery from the Kubernetes API, as an alternative to a static replica list.

A pool whose config has ``discovery:`` (``DiscoveryConfig`` in taskplane/config.py)
takes its replicas from the cluster: the EndpointSlices of a headless Service over the
vLLM pods (default), or the pods matching a label selector. Only ready endpoints
become replicas, so a pod that scales up joins once its readiness probe passes and a
pod that scales down (or fails its probe) leaves, without restarting the gateway.

The watcher is the informer pattern done small, over plain httpx: list (with
pagination) to get the state and a ``resourceVersion``, then ``watch=1`` from that
version; a watch that ends is renewed from the last version seen, one that has
expired (410) is replaced by a fresh list, and any other error is retried after a
delay. While the API is unreachable the last known replicas are kept: the gateway's
own health checks take dead replicas out, discovery only changes membership.

Credentials are the pod's service account and the cluster CA (``kube_access.py``);
``api_url`` points elsewhere (tests, ``kubectl proxy``). The objects become replicas in
``kube_replicas.py``.

The gateway calls::

    await watch(pool, on_change)     # runs until cancelled

where ``on_change(replicas)`` receives the pool's full list of discovered
``ReplicaConfig`` (sorted by name) once at start and again whenever it changes.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, aclosing
from typing import Any

import httpx
import structlog

from taskplane.config import DiscoveryConfig, PoolConfig, ReplicaConfig
from taskplane.engines.kube_access import KubeAccess, resolve_access
from taskplane.engines.kube_replicas import replicas_from_endpointslices, replicas_from_pods
from taskplane.errors import ConfigError

log = structlog.get_logger(__name__)

#: The label the EndpointSlice controller puts on every slice of a Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"

#: Called with the pool's discovered replicas; may be a plain function or a coroutine.
ReplicaCallback = Callable[[list[ReplicaConfig]], Awaitable[None] | None]

_MAX_RETRY_DELAY_S = 60.0
_LIST_PAGE = 500


class KubernetesApiError(Exception):
    """A non-success answer from the API server (HTTP status or a watch ERROR event)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason


class _Expired(KubernetesApiError):
    """410: the resourceVersion (or continue token) is too old; list again."""


def _status_error(body: Any, code: int) -> KubernetesApiError:
    reason, message = "Error", ""
    if isinstance(body, dict):
        reason = str(body.get("reason") or reason)
        message = str(body.get("message") or "")
        code = int(body.get("code") or code)
    cls = _Expired if code == 410 else KubernetesApiError
    return cls(code, reason, message)


def _hint(exc: KubernetesApiError) -> str:
    if exc.code == 401:
        return "the service account token was refused"
    if exc.code == 403:
        return "grant get/list/watch on endpointslices and pods (deploy/k8s/base/gateway/rbac.yaml)"
    return ""


class KubernetesDiscovery:
    """Follows one pool's replicas in the Kubernetes API (see the module docstring)."""

    def __init__(
        self,
        pool: PoolConfig,
        *,
        client: httpx.AsyncClient | None = None,
        access: KubeAccess | None = None,
    ) -> None:
        if pool.discovery is None:
            raise ConfigError(f"pool {pool.model}: no 'discovery:' section to discover replicas from")
        self.pool = pool
        self.cfg: DiscoveryConfig = pool.discovery
        self.access = access or resolve_access(self.cfg)
        self._client = client
        self._objects: dict[str, dict[str, Any]] = {}
        self._resource_version = ""
        self._warned: set[str] = set()
        self._log = log.bind(pool=pool.model, source=self.cfg.source, namespace=self.access.namespace)

    # -- what to ask for ------------------------------------------------------------

    @property
    def path(self) -> str:
        ns = self.access.namespace
        if self.cfg.source == "pods":
            return f"/api/v1/namespaces/{ns}/pods"
        return f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"

    @property
    def label_selector(self) -> str:
        parts = []
        if self.cfg.source == "endpointslices" and self.cfg.service:
            parts.append(f"{SERVICE_NAME_LABEL}={self.cfg.service}")
        if self.cfg.label_selector:
            parts.append(self.cfg.label_selector)
        return ",".join(parts)

    def replicas(self) -> list[ReplicaConfig]:
        """The replicas the objects seen so far describe."""
        if self.cfg.source == "pods":
            return replicas_from_pods(self._objects.values(), self.cfg, warn=self._warn)
        return replicas_from_endpointslices(self._objects.values(), self.cfg, warn=self._warn)

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            self._log.warning("discovery_misconfigured", problem=message)

    # -- HTTP -----------------------------------------------------------------------

    async def _get_json(self, client: httpx.AsyncClient, params: dict[str, str]) -> dict[str, Any]:
        resp = await client.get(self.access.base_url + self.path, params=params, headers=self.access.headers())
        try:
            body = resp.json()
        except json.JSONDecodeError:
            body = None
        if resp.status_code != 200:
            raise _status_error(body, resp.status_code)
        if not isinstance(body, dict):
            raise KubernetesApiError(resp.status_code, "BadResponse", "expected a JSON object")
        return body

    async def _list(self, client: httpx.AsyncClient) -> None:
        """Replace the known objects (and resourceVersion) with a fresh list."""
        objects: dict[str, dict[str, Any]] = {}
        params = {"limit": str(_LIST_PAGE)}
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        while True:
            body = await self._get_json(client, params)
            for item in body.get("items") or []:
                objects[item["metadata"]["name"]] = item
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                self._objects = objects
                self._resource_version = str(meta.get("resourceVersion", ""))
                return
            params["continue"] = str(token)

    async def _watch(self, client: httpx.AsyncClient) -> AsyncGenerator[None, None]:
        """Apply watch events to the known objects, from and advancing
        ``self._resource_version``; yield after each event."""
        params = {
            "watch": "1",
            "resourceVersion": self._resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.cfg.watch_timeout_s),
        }
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        timeout = httpx.Timeout(10.0, read=self.cfg.watch_timeout_s + 30.0)
        async with client.stream(
            "GET", self.access.base_url + self.path, params=params, headers=self.access.headers(), timeout=timeout
        ) as resp:
            if resp.status_code != 200:
                body_text = await resp.aread()
                try:
                    body = json.loads(body_text)
                except json.JSONDecodeError:
                    body = None
                raise _status_error(body, resp.status_code)
            async for line in resp.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise _status_error(obj, 500)
                if kind in ("ADDED", "MODIFIED"):
                    self._objects[obj["metadata"]["name"]] = obj
                elif kind == "DELETED":
                    self._objects.pop(obj["metadata"]["name"], None)
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    self._resource_version = str(rv)
                yield None

    # -- the loop -------------------------------------------------------------------

    async def list_replicas(self) -> list[ReplicaConfig]:
        """One list, no watch: the replicas right now."""
        async with self._session() as client:
            await self._list(client)
        return self.replicas()

    def _session(self) -> AbstractAsyncContextManager[httpx.AsyncClient]:
        if self._client is not None:
            return _Borrowed(self._client)
        return httpx.AsyncClient(verify=self.access.verify, timeout=httpx.Timeout(30.0))

    async def snapshots(self) -> AsyncGenerator[list[ReplicaConfig], None]:
        """Yield the replica list after the first successful list and on every change.

        Runs until the consumer stops iterating (or the task is cancelled).
        """
        last: list[ReplicaConfig] | None = None
        failures = 0
        async with self._session() as client:
            while True:
                try:
                    await self._list(client)
                    failures = 0
                    current = self.replicas()
                    if current != last:
                        self._report(last, current)
                        last = current
                        yield list(current)
                    if not self.cfg.watch:
                        await asyncio.sleep(self.cfg.poll_interval_s)
                        continue
                    while True:  # renew each watch that times out, from the last version seen
                        async with aclosing(self._watch(client)) as events:
                            async for _ in events:
                                current = self.replicas()
                                if current != last:
                                    self._report(last, current)
                                    last = current
                                    yield list(current)
                except _Expired:
                    self._log.info("discovery_relist", reason="resourceVersion expired")
                except (httpx.HTTPError, KubernetesApiError, ValueError, KeyError) as exc:
                    failures += 1
                    delay = min(self.cfg.poll_interval_s * 2 ** (failures - 1), _MAX_RETRY_DELAY_S)
                    hint = _hint(exc) if isinstance(exc, KubernetesApiError) else ""
                    self._log.warning(
                        "discovery_api_error", error=str(exc) or type(exc).__name__, hint=hint,
                        retry_in_s=delay, url=self.access.base_url + self.path,
                    )
                    await asyncio.sleep(delay)

    def _report(self, before: list[ReplicaConfig] | None, after: list[ReplicaConfig]) -> None:
        old = {r.replica_name for r in before or []}
        new = {r.replica_name for r in after}
        self._log.info(
            "discovery_replicas", count=len(after), added=sorted(new - old), removed=sorted(old - new)
        )


class _Borrowed(AbstractAsyncContextManager[httpx.AsyncClient]):
    """Async context manager around a caller's client that does not close it."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def __aenter__(self) -> httpx.AsyncClient:
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        return None


async def watch(
    pool: PoolConfig,
    on_change: ReplicaCallback,
    *,
    client: httpx.AsyncClient | None = None,
    access: KubeAccess | None = None,
) -> None:
    """Follow ``pool``'s replicas in Kubernetes until cancelled.

    ``on_change`` receives the full, name-sorted list of discovered replicas once the
    first list succeeds and again on every change; an exception it raises stops the
    watch. Raises ``ConfigError`` at once when the pool cannot be discovered at all
    (no discovery section, not in a cluster and no api_url).
    """
    discovery = KubernetesDiscovery(pool, client=client, access=access)
    async with aclosing(discovery.snapshots()) as stream:
        async for replicas in stream:
            result = on_change(replicas)
            if inspect.isawaitable(result):
                await result


async def discover_once(
    pool: PoolConfig, *, client: httpx.AsyncClient | None = None, access: KubeAccess | None = None
) -> list[ReplicaConfig]:
    """The pool's ready replicas right now (one list call)."""
    return await KubernetesDiscovery(pool, client=client, access=access).list_replicas()
