"""The Kubernetes actuator: the vLLM Deployment's (or LeaderWorkerSet's) scale subresource,
``controller.kubernetes.io/pod-deletion-cost`` so the ReplicaSet controller deletes the
replica taskplane chose (the one whose loss re-prefills the fewest live tokens) rather than
its own default (the newest pod), and vLLM sleep mode for a hot start.

A replica is only scaled away once the fleet book says its drain is over (no placements,
calls in flight done): the actuator is told to *stop* a named pod, annotates it as the
cheapest to delete, then lowers ``spec.replicas`` by one with a merge patch.

With a pool's ``sleep_level`` (1 or 2) the drained victim is put to sleep instead
(:meth:`KubeActuator.retire`): ``POST /sleep?level=`` on its vLLM server through the API
server's pod proxy (``pods/{name}:{port}/proxy/...``: no pod network access needed, only
RBAC for ``pods/proxy``), annotated ``taskplane.io/sleep-level`` and given the second lowest
deletion cost, so a later scale-in by anyone removes sleepers first. ``spec.replicas`` is
unchanged: the pod keeps its GPU (the fleet book keeps paying for it). A scale-out wakes
sleepers first (:meth:`KubeActuator.scale_out`; ``POST /wake_up``, seconds) and only then
adds cold pods. The gateway keeps a sleeping pod out of placement by its
``vllm:engine_sleep_state`` gauge: vLLM's ``/health`` (the readiness probe) stays 200.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
SLEEP_LEVEL = "taskplane.io/sleep-level"
MIN_COST = -(2**31)
SLEEPER_COST = MIN_COST + 1  # after the drained victim, before every serving pod
_SCALE_PATHS = {
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale",
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale",
    "LeaderWorkerSet": "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets/{name}/scale",
}
_MERGE = {"Content-Type": "application/merge-patch+json"}
#: an offload or a reload of the weights takes seconds (level 2 wake: tens)
ENGINE_TIMEOUT_S = 300.0


class KubeError(RuntimeError):
    """The API server (or the engine behind its pod proxy) refused (its message included)."""


@dataclass(slots=True)
class KubeTarget:
    namespace: str
    name: str
    kind: str = "Deployment"  # or LeaderWorkerSet (multi-host vLLM), StatefulSet
    engine_port: int = 8000  # the vLLM server's port in the pod (sleep mode through the pod proxy)


class KubeActuator:
    def __init__(self, client: httpx.AsyncClient, target: KubeTarget, *, sleep_level: int = 0) -> None:
        if target.kind not in _SCALE_PATHS:
            raise ValueError(f"kind {target.kind!r}: choose from {', '.join(_SCALE_PATHS)}")
        if sleep_level not in (0, 1, 2):
            raise ValueError(f"sleep_level {sleep_level}: 0 (off), 1 or 2")
        self.client, self.target, self.sleep_level = client, target, sleep_level
        self.scale_path = _SCALE_PATHS[target.kind].format(ns=target.namespace, name=target.name)

    async def _check(self, resp: httpx.Response) -> dict[str, Any]:
        if resp.status_code >= 400:
            try:
                msg = resp.json().get("message", resp.text)
            except ValueError:
                msg = resp.text
            raise KubeError(f"{resp.request.method} {resp.request.url.path}: {resp.status_code} {msg}")
        return resp.json()  # type: ignore[no-any-return]

    def _pod_path(self, pod: str) -> str:
        return f"/api/v1/namespaces/{self.target.namespace}/pods/{pod}"

    async def _scale(self) -> dict[str, Any]:
        return await self._check(await self.client.get(self.scale_path))

    async def replicas(self) -> int:
        """``spec.replicas`` of the scale subresource."""
        return int((await self._scale()).get("spec", {}).get("replicas", 0))

    async def scale_to(self, n: int) -> int:
        """Set ``spec.replicas`` (merge patch: no read-modify-write race on the count)."""
        body = {"spec": {"replicas": int(n)}}
        scale = await self._check(await self.client.patch(self.scale_path, json=body, headers=_MERGE))
        return int(scale["spec"]["replicas"])

    async def annotate(self, pod: str, annotations: dict[str, str | None]) -> None:
        """Merge-patch a pod's annotations (None removes one)."""
        body = {"metadata": {"annotations": annotations}}
        await self._check(await self.client.patch(self._pod_path(pod), json=body, headers=_MERGE))

    async def set_deletion_costs(self, costs: dict[str, int]) -> None:
        """Annotate pods with their deletion cost (the controller deletes the lowest first)."""
        for pod, cost in costs.items():
            await self.annotate(pod, {DELETION_COST: str(int(cost))})

    async def pods(self) -> list[dict[str, Any]]:
        """The workload's pods (by the scale subresource's ``status.selector``), by name."""
        selector = (await self._scale()).get("status", {}).get("selector", "")
        listed = await self._check(await self.client.get(
            f"/api/v1/namespaces/{self.target.namespace}/pods", params={"labelSelector": selector}))
        return sorted(listed.get("items", []), key=lambda p: str(p["metadata"]["name"]))

    async def sleeping_pods(self) -> list[str]:
        """Pods taskplane put to sleep (annotated ``taskplane.io/sleep-level``)."""
        return [p["metadata"]["name"] for p in await self.pods()
                if SLEEP_LEVEL in (p["metadata"].get("annotations") or {})]

    async def start(self, count: int = 1) -> int:
        """Add ``count`` cold replicas (their cold start is the pod's readiness)."""
        return await self.scale_to(await self.replicas() + count)

    async def stop(self, pod: str) -> int:
        """Remove exactly ``pod`` (drained, or asleep): lowest deletion cost, then one replica fewer."""
        await self.set_deletion_costs({pod: MIN_COST})
        return await self.scale_to(max(0, await self.replicas() - 1))

    async def _engine(self, pod: str, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        url = f"{self._pod_path(pod)}:{self.target.engine_port}/proxy/{path}"
        return await self._check(await self.client.post(url, params=params, timeout=ENGINE_TIMEOUT_S))

    async def sleep(self, pod: str, level: int | None = None) -> None:
        """Put a drained pod's engine to sleep; it stays provisioned (its GPU held) for a hot start."""
        level = self.sleep_level if level is None else level
        if level not in (1, 2):
            raise ValueError(f"sleep level {level}: 1 or 2")
        await self.annotate(pod, {SLEEP_LEVEL: str(level), DELETION_COST: str(SLEEPER_COST)})
        try:
            # mode=wait: a call still in flight finishes first (never fail one); older vLLM ignores it
            await self._engine(pod, "sleep", {"level": level, "mode": "wait"})
        except KubeError:
            await self.annotate(pod, {SLEEP_LEVEL: None, DELETION_COST: None})
            raise

    async def wake(self, pod: str) -> None:
        """Wake a sleeping pod's engine (seconds at level 1); it serves once the gateway's next
        scrape sees it awake."""
        answer = await self._engine(pod, "wake_up")
        if answer.get("status") != "awake":
            raise KubeError(f"wake_up {pod}: still {answer.get('status')!r}")
        await self.annotate(pod, {SLEEP_LEVEL: None, DELETION_COST: None})

    async def retire(self, pod: str) -> str:
        """A drained scale-in victim: asleep (``sleep_level``) or removed. Returns which."""
        if self.sleep_level:
            await self.sleep(pod)
            return "slept"
        await self.stop(pod)
        return "stopped"

    async def scale_out(self, count: int) -> tuple[list[str], int]:
        """``count`` more serving replicas: sleepers woken first (a hot start), the rest cold.
        Returns the pods woken and ``spec.replicas``."""
        woken: list[str] = []
        for pod in (await self.sleeping_pods())[:count]:
            await self.wake(pod)
            woken.append(pod)
        rest = count - len(woken)
        return woken, (await self.start(rest) if rest > 0 else await self.replicas())
