"""Adapter pre-loads and unloads in the cluster simulator: a policy's plan of which adapters
to load where ahead of demand and which to unload where demand is lowest, carried out on the
engines as ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` would.

A policy plans when its pipeline holds a plugin with ``plan(views, now_s)`` and
``preloaded(replica, adapter)`` whose params turn ``preload`` on (the ``adapter-residency``
scorer); one that also offers ``unloads(views, now_s)`` and ``unloaded(replica, adapter)``
has its unloads carried out first. The plan runs at most every ``every_s`` virtual seconds,
at a call's offer (so a run without adapter calls, or without such a plugin, is untouched),
from the views a live picker would have. A pre-load registers the adapter again where it
was unloaded, reads its weights into the engine's host memory and holds its next step for
the read (``Adapters.preload``); an unload unregisters it (refused, as by vLLM, while it
runs). The replica's view then lists what its ``/v1/models`` would (``lora_served``).
"""

from __future__ import annotations

from typing import Any

from taskplane.scheduler.scorers.residency import find_planner
from taskplane.scheduler.types import ReplicaView
from taskplane.sim.lora import LoraError

__all__ = ["Preloads", "find_planner", "refusal"]


def refusal(engine: Any, adapter: str | None) -> str | None:
    """``"model_not_found"`` when ``engine`` has LoRA on and ``adapter`` is not registered
    there (vLLM answers 404; the gateway retries the call elsewhere), else None."""
    lora = engine.adapters
    if adapter and lora is not None and adapter not in lora.registered:
        return "model_not_found"
    return None


class Preloads:
    """Runs ``planner``'s plan on ``fleet``'s engines every ``every_s`` virtual seconds."""

    def __init__(self, planner: Any, fleet: Any, every_s: float = 1.0) -> None:
        self.planner, self.fleet, self.every_s = planner, fleet, every_s
        self._next = 0.0
        self._paths: dict[str, str] = {}  # adapter -> its path, as /v1/models lists it (root)
        self.unloads = 0

    def maybe_plan(self, now_s: float) -> None:
        if now_s < self._next:
            return
        self._next = now_s + self.every_s
        self.fleet.snapshot()
        unloads = getattr(self.planner, "unloads", None)
        if unloads is not None:
            for replica, adapter in unloads(self._views(), now_s):
                self._unload(replica, adapter)
        for replica, adapter in self.planner.plan(self._views(), now_s):
            i = self.fleet.find(replica)
            engine = self.fleet.engines[i] if i is not None else None
            if engine is None or engine.adapters is None:
                continue
            if adapter not in engine.adapters.registered and not self._register(i, adapter):
                continue
            if engine.adapters.preload(adapter, now_s):
                self.planner.preloaded(replica, adapter)
                self.fleet.mark(i)

    def _views(self) -> list[ReplicaView]:
        return [v for v in self.fleet.views if v.max_loras > 0]

    def _unload(self, replica: str, adapter: str) -> None:
        i = self.fleet.find(replica)
        engine = self.fleet.engines[i] if i is not None else None
        if engine is None or engine.adapters is None or adapter not in engine.adapters.registered:
            return
        self._paths.setdefault(adapter, engine.adapters.registered[adapter].path)
        try:
            engine.adapters.unregister(adapter)
        except LoraError:
            return  # in use by running requests: vLLM refuses too
        self._served(i)
        self.unloads += 1
        self.planner.unloaded(replica, adapter)

    def _register(self, i: int, adapter: str) -> bool:
        path = self._paths.get(adapter) or next(
            (e.adapters.registered[adapter].path for e in self.fleet.engines
             if e.adapters is not None and adapter in e.adapters.registered), None)
        if path is None:
            return False
        self.fleet.engines[i].adapters.register(adapter, path)
        self._served(i)
        return True

    def _served(self, i: int) -> None:
        """Replica ``i``'s view lists its registered adapters again (its next /v1/models)."""
        self.fleet.views[i].lora_served = frozenset(self.fleet.engines[i].adapters.registered)
        self.fleet.mark(i)
