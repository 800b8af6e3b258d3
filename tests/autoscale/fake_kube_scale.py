"""A fake of the Kubernetes API server's scale subresource and pod patches, with the
ReplicaSet controller's scale-down order, for the Kubernetes actuator's tests.

Wire shapes as the real server: ``GET``/``PATCH`` (``application/merge-patch+json``; other
patch types answer 415) of ``.../deployments/{name}/scale`` and
``.../leaderworkersets/{name}/scale`` return an ``autoscaling/v1`` ``Scale``; ``PATCH
/api/v1/namespaces/{ns}/pods/{name}`` merges metadata; a missing object is a 404 ``Status``;
a negative replica count is a 422 ``Invalid`` Status. On scale-down the fake deletes pods as
the controller does (``pkg/controller/replicaset``: lower pod-deletion-cost first, then the
newer pod); on scale-up it creates pods named ``{name}-{n}``, labelled ``app={name}`` (the
Scale's ``status.selector``). ``GET /api/v1/namespaces/{ns}/pods?labelSelector=k=v`` lists
them as a ``PodList``. Every change bumps one resourceVersion.

The pod proxy subresource (``/api/v1/namespaces/{ns}/pods/{name}:{port}/proxy/{path}``)
forwards the request to the engine behind the pod, as the API server does: a new pod takes
the first free URL of ``backends`` (real ``taskplane sim-engine`` processes in the tests);
a pod with none answers 503 ``ServiceUnavailable`` as the real proxy does for a pod it
cannot reach. A pod's ``status.podIP`` is its backend's host and its container ports are
``ports``, so the gateway's pod discovery finds the engine behind it.

With ``mirror`` (the discovery tests' ``FakeKubeApi``, which speaks list and watch), every
pod change is mirrored there (:meth:`FakeScaleApi.sync_mirror`, called after each change
the HTTP API makes), so a gateway watching the pods sees what the controller did; serve
:meth:`FakeScaleApi.cluster_app` for both.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

COST = "controller.kubernetes.io/pod-deletion-cost"


def status(code: int, reason: str, message: str) -> JSONResponse:
    return JSONResponse({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                         "message": message, "reason": reason, "code": code}, status_code=code)


def merge(dst: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch."""
    for k, v in patch.items():
        if v is None:
            dst.pop(k, None)
        elif isinstance(v, dict) and isinstance(dst.get(k), dict):
            merge(dst[k], v)
        else:
            dst[k] = v


@dataclass
class FakeScaleApi:
    namespace: str = "llm"
    workloads: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind plural, name) -> replicas
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    owner: dict[str, tuple[str, str]] = field(default_factory=dict)
    rv: int = 1
    deleted: list[str] = field(default_factory=list)
    backends: list[str] = field(default_factory=list)  # engine URLs, one per pod, in order of creation
    engine: dict[str, str] = field(default_factory=dict)  # pod -> its engine's URL
    proxied: list[str] = field(default_factory=list)  # "POST vllm-0:8000/sleep" as the engines saw them
    ports: dict[str, int] = field(default_factory=lambda: {"http": 8000})  # the vLLM container's named ports
    mirror: Any = None  # a tests/deploy/fake_kube.FakeKubeApi: pods listed and watched there too
    _mirrored: dict[str, str] = field(default_factory=dict)  # pod -> the JSON last mirrored
    _clock: Any = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.app = Starlette(routes=[
            Route("/apis/apps/v1/namespaces/{ns}/{plural}/{name}/scale", self._scale, methods=["GET", "PATCH"]),
            Route("/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/{plural}/{name}/scale", self._scale,
                  methods=["GET", "PATCH"]),
            Route("/api/v1/namespaces/{ns}/pods", self._pods, methods=["GET"]),
            Route("/api/v1/namespaces/{ns}/pods/{name}", self._pod, methods=["GET", "PATCH"]),
            Route("/api/v1/namespaces/{ns}/pods/{name}/proxy/{path:path}", self._proxy,
                  methods=["GET", "POST"]),
        ])

    def add_workload(self, plural: str, name: str, replicas: int) -> None:
        self.workloads[(plural, name)] = 0
        self._resize(plural, name, replicas)

    def _resize(self, plural: str, name: str, n: int) -> None:
        mine = [p for p, o in self.owner.items() if o == (plural, name)]
        while len(mine) < n:
            pod = f"{name}-{next(self._clock)}"
            free = [u for u in self.backends if u not in self.engine.values()]
            if free:
                self.engine[pod] = free[0]
            ip = urlsplit(self.engine[pod]).hostname if pod in self.engine else "127.0.0.1"
            container = {"name": "vllm", "ports": [{"name": n, "containerPort": p, "protocol": "TCP"}
                                                   for n, p in self.ports.items()]}
            self.pods[pod] = {"kind": "Pod", "apiVersion": "v1", "metadata": {
                "name": pod, "namespace": self.namespace, "labels": {"app": name}, "annotations": {},
                "creationOrder": len(self.pods)}, "spec": {"containers": [container]},
                "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}
            self.owner[pod] = (plural, name)
            mine.append(pod)
        if len(mine) > n:
            def rank(p: str) -> tuple[int, int]:
                meta = self.pods[p]["metadata"]
                return (int(meta["annotations"].get(COST, "0")), -int(meta["creationOrder"]))
            for pod in sorted(mine, key=rank)[: len(mine) - n]:
                del self.pods[pod]
                del self.owner[pod]
                self.engine.pop(pod, None)
                self.deleted.append(pod)
        self.workloads[(plural, name)] = n
        self.rv += 1

    async def sync_mirror(self) -> None:
        """Copy every pod change to ``mirror`` (puts for new or changed pods, deletes for gone ones)."""
        if self.mirror is None:
            return
        for name, pod in self.pods.items():
            text = json.dumps(pod, sort_keys=True)
            if self._mirrored.get(name) != text:
                await self.mirror.put("pods", json.loads(text))
                self._mirrored[name] = text
        for name in [n for n in self._mirrored if n not in self.pods]:
            await self.mirror.delete("pods", self.namespace, name)
            del self._mirrored[name]

    def cluster_app(self) -> Starlette:
        """One API server: the mirror's pod list and watch, then this fake's scale, pod and proxy routes."""
        return Starlette(routes=[*(self.mirror.app.routes if self.mirror is not None else []), *self.app.routes])

    def _scale_obj(self, plural: str, name: str) -> dict[str, Any]:
        n = self.workloads[(plural, name)]
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": name, "namespace": self.namespace, "resourceVersion": str(self.rv)},
                "spec": {"replicas": n}, "status": {"replicas": n, "selector": f"app={name}"}}

    async def _scale(self, request: Request) -> Response:
        plural, name = request.path_params["plural"], request.path_params["name"]
        if request.path_params["ns"] != self.namespace or (plural, name) not in self.workloads:
            return status(404, "NotFound", f'{plural}.apps "{name}" not found')
        if request.method == "PATCH":
            if request.headers.get("content-type") != "application/merge-patch+json":
                return status(415, "UnsupportedMediaType", "the body of the request was in an unknown format")
            body = await request.json()
            n = body.get("spec", {}).get("replicas")
            if not isinstance(n, int) or n < 0:
                return status(422, "Invalid", f"Scale.autoscaling \"{name}\" is invalid: spec.replicas: must be >= 0")
            self._resize(plural, name, n)
            await self.sync_mirror()
        return JSONResponse(self._scale_obj(plural, name))

    async def _pods(self, request: Request) -> Response:
        if request.path_params["ns"] != self.namespace:
            return JSONResponse({"kind": "PodList", "apiVersion": "v1", "items": []})
        want = dict(kv.split("=", 1) for kv in request.query_params.get("labelSelector", "").split(",") if kv)
        items = [p for p in self.pods.values()
                 if all(p["metadata"]["labels"].get(k) == v for k, v in want.items())]
        return JSONResponse({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)},
                             "items": items})

    async def _proxy(self, request: Request) -> Response:
        name, _, port = request.path_params["name"].partition(":")
        if name not in self.pods or request.path_params["ns"] != self.namespace:
            return status(404, "NotFound", f'pods "{name}" not found')
        url = self.engine.get(name)
        if url is None:
            return status(503, "ServiceUnavailable", f"error trying to reach service: dial tcp {name}:{port}")
        path = request.path_params["path"]
        self.proxied.append(f"{request.method} {name}:{port}/{path}")
        async with httpx.AsyncClient(timeout=300) as c:
            resp = await c.request(request.method, f"{url}/{path}", params=list(request.query_params.multi_items()),
                                   content=await request.body())
        return Response(resp.content, status_code=resp.status_code,
                        media_type=resp.headers.get("content-type"))

    async def _pod(self, request: Request) -> Response:
        name = request.path_params["name"]
        pod = self.pods.get(name)
        if pod is None or request.path_params["ns"] != self.namespace:
            return status(404, "NotFound", f'pods "{name}" not found')
        if request.method == "PATCH":
            if request.headers.get("content-type") != "application/merge-patch+json":
                return status(415, "UnsupportedMediaType", "the body of the request was in an unknown format")
            merge(pod, await request.json())
            self.rv += 1
            await self.sync_mirror()
        return JSONResponse(pod)
