"""The Kubernetes actuator: the vLLM Deployment's (or LeaderWorkerSet's) scale subresource,
and ``controller.kubernetes.io/pod-deletion-cost`` so the ReplicaSet controller deletes the
replica taskplane chose (the one whose loss re-prefills the fewest live tokens) rather than
its own default (the newest pod).

A replica is only scaled away once the fleet book says its drain is over (no placements,
calls in flight done): the actuator is told to *stop* a named pod, annotates it as the
cheapest to delete, then lowers ``spec.replicas`` by one with a merge patch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MIN_COST = -(2**31)
_SCALE_PATHS = {
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale",
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale",
    "LeaderWorkerSet": "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets/{name}/scale",
}
_MERGE = {"Content-Type": "application/merge-patch+json"}


class KubeError(RuntimeError):
    """The API server refused (its Status message included)."""


@dataclass(slots=True)
class KubeTarget:
    namespace: str
    name: str
    kind: str = "Deployment"  # or LeaderWorkerSet (multi-host vLLM), StatefulSet


class KubeActuator:
    def __init__(self, client: httpx.AsyncClient, target: KubeTarget) -> None:
        if target.kind not in _SCALE_PATHS:
            raise ValueError(f"kind {target.kind!r}: choose from {', '.join(_SCALE_PATHS)}")
        self.client, self.target = client, target
        self.scale_path = _SCALE_PATHS[target.kind].format(ns=target.namespace, name=target.name)

    async def _check(self, resp: httpx.Response) -> dict[str, Any]:
        if resp.status_code >= 400:
            try:
                msg = resp.json().get("message", resp.text)
            except ValueError:
                msg = resp.text
            raise KubeError(f"{resp.request.method} {resp.request.url.path}: {resp.status_code} {msg}")
        return resp.json()  # type: ignore[no-any-return]

    async def replicas(self) -> int:
        """``spec.replicas`` of the scale subresource."""
        scale = await self._check(await self.client.get(self.scale_path))
        return int(scale.get("spec", {}).get("replicas", 0))

    async def scale_to(self, n: int) -> int:
        """Set ``spec.replicas`` (merge patch: no read-modify-write race on the count)."""
        body = {"spec": {"replicas": int(n)}}
        scale = await self._check(await self.client.patch(self.scale_path, json=body, headers=_MERGE))
        return int(scale["spec"]["replicas"])

    async def set_deletion_costs(self, costs: dict[str, int]) -> None:
        """Annotate pods with their deletion cost (the controller deletes the lowest first)."""
        for pod, cost in costs.items():
            path = f"/api/v1/namespaces/{self.target.namespace}/pods/{pod}"
            body = {"metadata": {"annotations": {DELETION_COST: str(int(cost))}}}
            await self._check(await self.client.patch(path, json=body, headers=_MERGE))

    async def start(self, count: int = 1) -> int:
        """Add ``count`` replicas (their cold start is the pod's readiness)."""
        return await self.scale_to(await self.replicas() + count)

    async def stop(self, pod: str) -> int:
        """Remove exactly ``pod`` (drained): lowest deletion cost, then one replica fewer."""
        await self.set_deletion_costs({pod: MIN_COST})
        return await self.scale_to(max(0, await self.replicas() - 1))
