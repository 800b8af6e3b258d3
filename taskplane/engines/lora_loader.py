"""The live adapter loader: the scheduler's pre-load plan carried out with vLLM's runtime
LoRA API.

Every ``interval_s`` the ``adapter-residency`` plugin (``preload`` on) plans, from the
replicas' views, which adapters to load where ahead of demand (scheduler/scorers/residency.py);
each pre-load is ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` to that replica,
the path being the adapter's ``root`` in the ``/v1/models`` of a replica already serving it.
Before the pre-loads, the plan's unloads (``unload`` on): ``POST /v1/unload_lora_adapter
{"lora_name"}`` where an adapter's predicted demand is lowest and a busier one needs its
slot (log line ``adapter_unloaded``; a 404 means it is gone already).
Only adapters whose sessions were seen are planned (``prior=False``): which adapters a fleet
serves at all is the operator's registrations.
vLLM registers the adapter and reads it into host memory, so the next session's first call
there does not pay the disk read; the next scrape lists it in ``lora_served`` and the
``adapter-served`` filter lets its calls go there. A 400 (already loaded there) counts as
held. A 404 means the replica has no runtime LoRA API (vLLM serves it only with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=true``): that replica is not asked again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import structlog

from taskplane.engines.registry import ReplicaRegistry

log = structlog.get_logger(__name__)


class AdapterLoader:
    """Runs ``planner``'s pre-loads on ``registry``'s replicas."""

    def __init__(self, registry: ReplicaRegistry, planner: Any, *, interval_s: float = 2.0) -> None:
        self.registry, self.planner, self.interval_s = registry, planner, interval_s
        self.loaded = 0
        self.unloaded = 0
        self._no_api: set[str] = set()

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=30.0) as client:
            while True:
                await asyncio.sleep(self.interval_s)
                try:
                    await self.step(client)
                except Exception as exc:  # never let the loop die
                    log.warning("adapter_loader_error", error=str(exc))

    def _path(self, adapter: str) -> str | None:
        return next((s.lora_roots[adapter] for s in self.registry.replicas.values() if adapter in s.lora_roots), None)

    async def step(self, client: httpx.AsyncClient) -> int:
        """One plan, carried out; the adapters loaded."""
        views = [v for v in self.registry.views() if v.name not in self._no_api]
        self.unloaded += await self._unload(client, views)
        done = 0
        for replica, adapter in self.planner.plan(views, time.monotonic(), prior=False):
            state, path = self.registry.replicas.get(replica), self._path(adapter)
            if state is None or path is None:
                continue
            r = await client.post(f"{state.config.url}/v1/load_lora_adapter",
                                  json={"lora_name": adapter, "lora_path": path})
            if r.status_code == 404:
                self._no_api.add(replica)
                log.info("adapter_loader_no_runtime_api", replica=replica)
                continue
            if r.status_code in (200, 400):  # loaded, or already there
                self.planner.preloaded(replica, adapter)
            if r.status_code == 200:
                done += 1
                log.info("adapter_preloaded", replica=replica, adapter=adapter)
                await self.registry.scrape(state)
        self.loaded += done
        return done

    async def _unload(self, client: httpx.AsyncClient, views: list[Any]) -> int:
        """The plan's unloads (``POST /v1/unload_lora_adapter``); the adapters unloaded."""
        plan = getattr(self.planner, "unloads", None)
        done = 0
        for replica, adapter in plan(views, time.monotonic()) if plan is not None else ():
            state = self.registry.replicas.get(replica)
            if state is None:
                continue
            r = await client.post(f"{state.config.url}/v1/unload_lora_adapter", json={"lora_name": adapter})
            if r.status_code in (200, 404):  # unloaded, or not there any more
                self.planner.unloaded(replica, adapter)
            if r.status_code == 200:
                done += 1
                log.info("adapter_unloaded", replica=replica, adapter=adapter)
                await self.registry.scrape(state)
        return done


def start_adapter_loader(registry: ReplicaRegistry, placer: Any) -> asyncio.Task[None] | None:
    """The loader's task when the placer's scheduler plans pre-loads, else None."""
    from taskplane.scheduler.scorers.residency import find_planner

    planner = find_planner(getattr(placer, "scheduler", None))
    if planner is None:
        return None
    return asyncio.create_task(AdapterLoader(registry, planner).run(), name="adapter-loader")
