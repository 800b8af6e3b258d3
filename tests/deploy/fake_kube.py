"""A small fake of the Kubernetes API server for the discovery tests.

A real API server cannot run here, so this one serves the subset discovery uses, with
the real wire shapes:

- ``GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices`` and
  ``GET /api/v1/namespaces/{ns}/pods``: a list (``{"kind": "EndpointSliceList",
  "apiVersion": ..., "metadata": {"resourceVersion": ...}, "items": [...]}``, items
  without kind/apiVersion as the server sends them), ``labelSelector`` (equality,
  inequality, existence and set-based terms), ``limit``/``continue`` pagination over
  a consistent snapshot.
- ``?watch=1``: newline-delimited JSON events ``{"type": ADDED|MODIFIED|DELETED|
  BOOKMARK|ERROR, "object": ...}`` from ``resourceVersion``; objects that stop (start)
  matching the selector arrive as DELETED (ADDED); a version older than the last
  compaction gets an ERROR event with a 410 ``Expired`` Status, as the server does;
  ``timeoutSeconds`` ends the stream; ``allowWatchBookmarks`` sends BOOKMARKs.
- Bearer-token auth (401 Status), per-namespace RBAC denial (403 Status), injected
  500s, and dropping live watches (gracefully or by cutting the connection).

Every object change bumps one global resourceVersion, as etcd's revision does.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import json
import re
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

RESOURCES = {
    "endpointslices": ("discovery.k8s.io/v1", "EndpointSlice", "discovery.k8s.io"),
    "pods": ("v1", "Pod", ""),
}


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


# --- label selectors ------------------------------------------------------------------

_SET_TERM = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_terms(selector: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        terms.append(cur)
    return terms


def parse_selector(selector: str) -> list[tuple[str, str, frozenset[str]]]:
    """Requirements (key, op, values); raises ValueError like the server's 400."""
    reqs = []
    for term in _split_terms(selector):
        term = term.strip()
        if not term:
            raise ValueError(f"found '', expected: identifier in {selector!r}")
        if m := _SET_TERM.match(term):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append((m.group(1), m.group(2), values))
        elif "!=" in term:
            k, v = term.split("!=", 1)
            reqs.append((k.strip(), "!=", frozenset([v.strip()])))
        elif "==" in term or "=" in term:
            k, v = term.split("==", 1) if "==" in term else term.split("=", 1)
            reqs.append((k.strip(), "=", frozenset([v.strip()])))
        elif term.startswith("!"):
            reqs.append((term[1:].strip(), "!exists", frozenset()))
        elif re.fullmatch(r"[\w./-]+", term):
            reqs.append((term, "exists", frozenset()))
        else:
            raise ValueError(f"unable to parse requirement: {term!r}")
    return reqs


def matches(reqs: list[tuple[str, str, frozenset[str]]], labels: dict[str, str]) -> bool:
    for key, op, values in reqs:
        has = key in labels
        val = labels.get(key)
        ok = {
            "=": has and val in values,
            "!=": not has or val not in values,
            "in": has and val in values,
            "notin": not has or val not in values,
            "exists": has,
            "!exists": not has,
        }[op]
        if not ok:
            return False
    return True


# --- the store ------------------------------------------------------------------------


@dataclass
class _Event:
    rv: int
    resource: str
    namespace: str
    type: str  # ADDED, MODIFIED, DELETED
    old: dict[str, Any] | None
    new: dict[str, Any]


@dataclass
class FakeKubeApi:
    token: str | None = "fake-service-account-token"
    bookmark_interval_s: float = 0.5
    forbidden_namespaces: set[str] = field(default_factory=set)
    fail_next: int = 0
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.expired_sent = 0
        self._rv = 1000
        self._objects: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self._log: list[_Event] = []
        self._compacted = 0
        self._changed = asyncio.Condition()
        self._drop_generation = 0
        self._drop_abrupt = False
        self._snapshots: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        self.app = Starlette(
            routes=[
                Route("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self._endpointslices),
                Route("/api/v1/namespaces/{ns}/pods", self._pods),
            ]
        )

    # mutations, as controllers would make them

    @property
    def resource_version(self) -> int:
        return self._rv

    async def put(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object; returns it with server-set metadata."""
        meta = obj.setdefault("metadata", {})
        ns, name = meta["namespace"], meta["name"]
        bucket = self._objects.setdefault((resource, ns), {})
        old = bucket.get(name)
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        meta["generation"] = (old["metadata"].get("generation", 0) + 1) if old else 1
        stored = json.loads(json.dumps(obj))
        bucket[name] = stored
        self._log.append(_Event(self._rv, resource, ns, "MODIFIED" if old else "ADDED", old, stored))
        async with self._changed:
            self._changed.notify_all()
        return stored

    async def delete(self, resource: str, namespace: str, name: str) -> None:
        old = self._objects.get((resource, namespace), {}).pop(name)
        self._rv += 1
        gone = json.loads(json.dumps(old))
        gone["metadata"]["resourceVersion"] = str(self._rv)
        self._log.append(_Event(self._rv, resource, namespace, "DELETED", old, gone))
        async with self._changed:
            self._changed.notify_all()

    def compact(self) -> None:
        """Forget history, as etcd compaction does: older versions now get 410."""
        self._compacted = self._rv
        self._log.clear()
        self._snapshots.clear()

    async def drop_watches(self, *, abrupt: bool = False) -> None:
        """End every open watch: gracefully, or by cutting the connection."""
        self._drop_abrupt = abrupt
        self._drop_generation += 1
        async with self._changed:
            self._changed.notify_all()

    def watch_requests(self) -> int:
        return sum(1 for _, q in self.requests if q.get("watch") in ("1", "true"))

    def list_requests(self) -> int:
        return sum(1 for _, q in self.requests if q.get("watch") not in ("1", "true"))

    # HTTP

    async def _endpointslices(self, request: Request) -> Response:
        return await self._serve(request, "endpointslices")

    async def _pods(self, request: Request) -> Response:
        return await self._serve(request, "pods")

    async def _serve(self, request: Request, resource: str) -> Response:
        ns = request.path_params["ns"]
        query = dict(request.query_params)
        self.requests.append((request.url.path, query))
        api_version, kind, group = RESOURCES[resource]
        if self.token is not None and request.headers.get("authorization") != f"Bearer {self.token}":
            return JSONResponse(status(401, "Unauthorized", "Unauthorized"), status_code=401)
        if ns in self.forbidden_namespaces:
            gr = f"{resource}.{group}" if group else resource
            msg = (f'{gr} is forbidden: User "system:serviceaccount:{ns}:taskplane-gateway" cannot list '
                   f'resource "{resource}" in API group "{group}" in the namespace "{ns}"')
            return JSONResponse(status(403, "Forbidden", msg), status_code=403)
        if self.fail_next > 0:
            self.fail_next -= 1
            return JSONResponse(status(500, "InternalError", "injected failure"), status_code=500)
        try:
            reqs = parse_selector(query.get("labelSelector", ""))
        except ValueError as exc:
            return JSONResponse(status(400, "BadRequest", str(exc)), status_code=400)
        if query.get("watch") in ("1", "true"):
            return StreamingResponse(
                self._watch_stream(resource, ns, reqs, query), media_type="application/json"
            )
        return self._list(resource, ns, reqs, query, api_version, kind)

    def _matching(self, resource: str, ns: str, reqs: list[Any]) -> list[dict[str, Any]]:
        bucket = self._objects.get((resource, ns), {})
        return [
            bucket[n] for n in sorted(bucket) if matches(reqs, bucket[n]["metadata"].get("labels") or {})
        ]

    def _list(self, resource: str, ns: str, reqs: list[Any], query: dict[str, str], api_version: str,
              kind: str) -> Response:
        token = query.get("continue")
        if token:
            snap = self._snapshots.get(token)
            if snap is None:
                return JSONResponse(
                    status(410, "Expired", "The provided continue parameter is too old to display a "
                           "consistent list result. You can start a new list without the continue parameter."),
                    status_code=410,
                )
            rv, items = snap
        else:
            rv, items = self._rv, self._matching(resource, ns, reqs)
        limit = int(query.get("limit") or 0)
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and len(items) > limit:
            page, rest = items[:limit], items[limit:]
            next_token = base64.urlsafe_b64encode(
                json.dumps({"rv": rv, "start": uuid.uuid4().hex}).encode()
            ).decode()
            self._snapshots[next_token] = (rv, rest)
            meta["continue"] = next_token
            meta["remainingItemCount"] = len(rest)
        else:
            page = items
        body = {
            "kind": f"{kind}List",
            "apiVersion": api_version,
            "metadata": meta,
            # The server omits kind/apiVersion on list items.
            "items": [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in page],
        }
        return JSONResponse(body)

    async def _watch_stream(
        self, resource: str, ns: str, reqs: list[Any], query: dict[str, str]
    ) -> AsyncIterator[bytes]:
        api_version, kind, _ = RESOURCES[resource]
        generation = self._drop_generation
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") == "true"

        def line(event_type: str, obj: dict[str, Any]) -> bytes:
            return (json.dumps({"type": event_type, "object": {"kind": kind, "apiVersion": api_version, **obj}})
                    + "\n").encode()

        rv_param = query.get("resourceVersion", "")
        if rv_param in ("", "0"):
            for obj in self._matching(resource, ns, reqs):
                yield line("ADDED", obj)
            cursor = self._rv
        else:
            cursor = int(rv_param)
            if cursor < self._compacted:
                self.expired_sent += 1
                err = status(410, "Expired", f"too old resource version: {cursor} ({self._compacted})")
                yield (json.dumps({"type": "ERROR", "object": err}) + "\n").encode()
                return
        last_bookmark = loop.time()
        while True:
            if self._drop_generation != generation:  # a cut connection sends nothing more
                if self._drop_abrupt:
                    raise ConnectionResetError("fake API server cut the watch")
                return
            start = bisect.bisect_right([e.rv for e in self._log], cursor)
            for ev in self._log[start:]:
                cursor = ev.rv
                if ev.resource != resource or ev.namespace != ns:
                    continue
                was = ev.old is not None and matches(reqs, ev.old["metadata"].get("labels") or {})
                now = matches(reqs, ev.new["metadata"].get("labels") or {})
                if ev.type == "DELETED":
                    if was:
                        yield line("DELETED", ev.new)
                elif now and was:
                    yield line("MODIFIED", ev.new)
                elif now:
                    yield line("ADDED", ev.new)
                elif was:
                    yield line("DELETED", ev.new)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            if bookmarks and loop.time() - last_bookmark >= self.bookmark_interval_s:
                # Everything up to cursor has been sent: the client may resume there.
                last_bookmark = loop.time()
                yield line("BOOKMARK", {"metadata": {"resourceVersion": str(max(cursor, self._compacted))}})
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), min(remaining, self.bookmark_interval_s))
                except TimeoutError:
                    pass


# --- object builders (the shapes the controllers write) --------------------------------


def endpoint_slice(
    name: str,
    namespace: str,
    service: str,
    endpoints: Iterable[tuple[str, str, bool]],
    ports: dict[str, int] | None = None,
    *,
    terminating: Iterable[str] = (),
    labels: dict[str, str] | None = None,
    address_type: str = "IPv4",
) -> dict[str, Any]:
    """An EndpointSlice as the EndpointSlice controller writes it for a Service.

    ``endpoints``: (pod name, pod IP, ready); ``ports``: Service port name -> target port.
    """
    ports = {"http": 8000, "kv-events": 5557} if ports is None else ports
    term = set(terminating)
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name,
            "generateName": f"{service}-",
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "service.kubernetes.io/headless": "",
                **(labels or {}),
            },
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Service", "name": service, "uid": str(uuid.uuid4()),
                 "controller": True, "blockOwnerDeletion": True}
            ],
        },
        "addressType": address_type,
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": ready and pod not in term, "serving": ready,
                               "terminating": pod in term},
                "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod, "uid": str(uuid.uuid4())},
                "nodeName": "gpu-node-1",
                "zone": "zone-a",
            }
            for pod, ip, ready in endpoints
        ],
        "ports": [{"name": n, "protocol": "TCP", "port": p} for n, p in ports.items()],
    }


def pod(
    name: str,
    namespace: str,
    ip: str | None,
    *,
    labels: dict[str, str],
    ready: bool = True,
    phase: str = "Running",
    ports: dict[str, int] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """A Pod of a vLLM Deployment, as the kubelet reports it."""
    ports = {"http": 8000, "kv-events": 5557} if ports is None else ports
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:05:00Z"
        meta["deletionGracePeriodSeconds"] = 30
    status_: dict[str, Any] = {
        "phase": phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": "True" if ready else "False"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ],
    }
    if ip:
        status_["podIP"] = ip
        status_["podIPs"] = [{"ip": ip}]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.10.2",
                    "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports.items()],
                }
            ]
        },
        "status": status_,
    }


@asynccontextmanager
async def serve(api: FakeKubeApi, *, certfile: str | None = None, keyfile: str | None = None
                ) -> AsyncIterator[str]:
    """Run the fake on a free loopback port; yield its base URL; stop it after."""
    config = uvicorn.Config(
        api.app, host="127.0.0.1", port=0, log_level="critical", lifespan="off",
        ssl_certfile=certfile, ssl_keyfile=keyfile, timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(500):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if not server.started:
        task.cancel()
        raise RuntimeError("fake Kubernetes API server did not start")
    port = server.servers[0].sockets[0].getsockname()[1]
    scheme = "https" if certfile else "http"
    try:
        yield f"{scheme}://127.0.0.1:{port}"
    finally:
        await api.drop_watches()
        server.should_exit = True
        await asyncio.wait_for(task, 15)
