"""Adapter binding: AIBrix's LoRA placement, each adapter bound to a fixed set of replicas.

AIBrix manages an adapter as a ``ModelAdapter`` resource: its controller selects
``replicas`` pods (1 unless set) for it with the ``least-adapters`` scheduler (the pods
holding the fewest adapters), loads the adapter there through vLLM's
``/v1/load_lora_adapter`` and publishes those pods as the adapter's Service endpoints; the
gateway then sends a call naming the adapter only to those endpoints, chosen among them by
its routing strategy (docs: aibrix ``docs/source/features/lora-dynamic-loading.rst``,
"Model Adapter Controller" and "Model Adapter Service Discovery"). A pod that fails loses its
bindings; the controller selects another pod for the adapter (its "pod switching").

This plugin keeps those bindings: the first time it sees an adapter (a call, or the fleet's
registered adapters in :meth:`AdapterBindingScorer.plan`, as the operator creates every
resource before traffic), it binds it, in name order, to the ``replicas`` healthy replicas
with the fewest bound adapters (ties by name); it scores 1 on an adapter's bound replicas and
0 elsewhere, so at a dominant weight it is the endpoint list and the next scorer is the
routing strategy. With ``preload`` the plan asks the planner (the cluster simulator, or the
live loader) to load each binding once, as the controller does. Calls without an adapter score
0 everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework.plugin import Scorer, Stateful, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.types import ReplicaView


@dataclass(slots=True)
class AdapterBindingParams:
    replicas: int = param(1, "pods each adapter is bound to (ModelAdapter spec.replicas; AIBrix's default 1)")
    preload: bool = param(True, "load each binding once on its replica (the controller's load at bind)")

    def validate(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be at least 1")


@register("adapter-binding")
class AdapterBindingScorer(Scorer, Stateful):
    """1 on the replicas an adapter is bound to (least-adapters at first sight), 0 elsewhere."""

    Params = AdapterBindingParams

    def __init__(self, params: AdapterBindingParams, **kw: object) -> None:
        super().__init__(params, **kw)  # type: ignore[arg-type]
        self._bound: dict[str, list[str]] = {}  # adapter -> its replicas
        self._count: dict[str, int] = {}  # replica -> adapters bound there
        self._loaded: set[tuple[str, str]] = set()

    def bind_adapter(self, adapter: str, views: list[ReplicaView]) -> list[str]:
        """``adapter``'s replicas, bound now to the least-adapters healthy ones if it has none."""
        have = self._bound.get(adapter)
        if have:
            return have
        able = sorted((v.name for v in views if v.healthy), key=lambda n: (self._count.get(n, 0), n))
        chosen = able[: self.params.replicas]
        if chosen:
            self._bound[adapter] = chosen
            for n in chosen:
                self._count[n] = self._count.get(n, 0) + 1
        return chosen

    def score(self, state: CycleState) -> np.ndarray:
        adapter = state.request.adapter
        if not adapter:
            return np.zeros(len(state.sel))
        views = [state.view(int(i)) for i in state.sel]
        bound = set(self.bind_adapter(adapter, views))
        return np.array([1.0 if v.name in bound else 0.0 for v in views], dtype=np.float64)

    def plan(self, views: list[ReplicaView], now_s: float, *, prior: bool = True) -> list[tuple[str, str]]:
        """(replica, adapter) loads of bindings not loaded yet; ``prior`` binds every adapter
        the fleet registers first (in name order), as resources created before traffic."""
        if prior:
            for adapter in sorted({a for v in views for a in (v.lora_served or ())}):
                self.bind_adapter(adapter, views)
        if not self.params.preload:
            return []
        return [(r, a) for a, rs in sorted(self._bound.items()) for r in rs if (r, a) not in self._loaded]

    def preloaded(self, replica: str, adapter: str) -> None:
        """The planner loaded ``adapter`` on ``replica``."""
        self._loaded.add((replica, adapter))

    def replica_removed(self, replica: str) -> None:
        """Its bindings go; the adapters bind again to other replicas at their next sight."""
        self._count.pop(replica, None)
        for adapter in [a for a, rs in self._bound.items() if replica in rs]:
            for r in self._bound.pop(adapter):
                if r != replica:
                    self._count[r] = max(0, self._count.get(r, 0) - 1)
        self._loaded = {(r, a) for r, a in self._loaded if r != replica}

    def replica_failed(self, replica: str) -> int:
        broken = sum(1 for rs in self._bound.values() if replica in rs)
        self.replica_removed(replica)
        return broken
