"""Adapter residency: where an adapter's weights probably still are, from the picker's own
placements, and which adapters to load ahead of demand.

``vllm:lora_requests_info`` names only the adapters of running and waiting requests: an
adapter whose last request ended a moment ago still has its GPU slot and its host copy, yet
looks cold. The picker knows where it sent each adapter's calls, and vLLM's LoRA caches are
least recently used first out, so an LRU mirror per replica of the adapters placed there
(``max_loras`` GPU slots from the metric; ``host_slots`` host copies, vLLM's
``--max-cpu-loras``, which no metric exports) says where a load is probably not needed.

The same plugin predicts each adapter's demand (an exponentially decayed rate of its new
sessions, the calls that pick a replica) and plans pre-loads (:meth:`AdapterResidencyScorer.plan`):
an adapter whose predicted share of new sessions calls for more holders than the mirror
shows is loaded, from disk into host memory, on the least busy replica lacking it, so the
next session's first call does not pay the disk read. A planner (the cluster simulator's
tick; live, a loop calling ``POST /v1/load_lora_adapter``) carries the plan out and reports
each load with :meth:`AdapterResidencyScorer.preloaded`.

Calls without an adapter score 0 everywhere and are not recorded: base-model placements
are unchanged.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from taskplane.scheduler.adapter_cost import Tier
from taskplane.scheduler.framework.handle import Handle
from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Scorer, Stateful, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.scorers.adapter_demand import ReplicaDemand, UnloadRule
from taskplane.scheduler.types import Decision, ReplicaView


@dataclass(slots=True)
class AdapterResidencyParams:
    gpu_score: float = param(1.0, "the adapter is probably in a GPU slot there (one of the last max_loras placed)")
    host_score: float = param(0.6, "its host copy is probably there (one of the last host_slots placed or "
                              "pre-loaded): a GPU copy, no disk read")
    host_slots: int = param(8, "host copies of adapters one replica keeps (vLLM --max-cpu-loras)")
    preload: bool = param(False, "plan pre-loads of hot adapters (``plan``) for a planner to carry out; off: "
                          "only the scores")
    half_life_s: float = param(60.0, "the decay of each adapter's new-session rate, the demand prediction")
    sessions_per_holder: float = param(0.05, "new sessions per second one replica holding an adapter absorbs "
                                       "before another should hold it too")
    max_preloads: int = param(8, "pre-loads one plan may ask for, at most one per replica (each holds its "
                              "replica's next step for one read)")
    prior_rate: float = param(1e-4, "the demand of an adapter registered on the fleet (/v1/models) whose "
                              "sessions were not seen yet: each gets one holder, after the adapters seen")
    preload_max_running: int = param(8, "pre-load only on replicas with at most this many calls running")
    unload: bool = param(False, "plan unloads (``unloads``): where more adapters have demand than GPU slots, the "
                         "least demanded one not running, waiting or pinned there, if another replica serves it")
    unload_half_life_s: float = param(30.0, "the decay of each adapter's call rate per replica (unloads)")
    unload_pin_window_s: float = param(60.0, "a session whose last call on a replica is this recent is pinned there")
    unload_session_weight: float = param(0.1, "calls per second one pinned session adds to its adapter's demand there")
    max_unloads: int = param(4, "unloads one plan may ask for, at most one per replica")

    def validate(self) -> None:
        if not (0.0 <= self.host_score <= 1.0 and 0.0 <= self.gpu_score <= 1.0):
            raise ValueError("gpu_score and host_score must be in [0, 1]")
        if self.host_slots < 1 or self.half_life_s <= 0 or self.sessions_per_holder <= 0:
            raise ValueError("host_slots, half_life_s and sessions_per_holder must be positive")
        if self.unload_half_life_s <= 0 or self.unload_pin_window_s < 0 or self.max_unloads < 0:
            raise ValueError("unload_half_life_s must be positive, unload_pin_window_s and max_unloads >= 0")


class _Lru:
    """Names, least recently used first, at most ``cap`` of them."""

    __slots__ = ("cap", "names")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.names: OrderedDict[str, None] = OrderedDict()

    def touch(self, name: str, cap: int | None = None) -> None:
        if cap is not None:
            self.cap = max(cap, 1)
        self.names[name] = None
        self.names.move_to_end(name)
        while len(self.names) > self.cap:
            self.names.popitem(last=False)


@register("adapter-residency")
class AdapterResidencyScorer(Scorer, Stateful):
    """1 where the call's adapter probably holds a GPU slot, ``host_score`` where its host
    copy probably is, 0 elsewhere (and for calls without an adapter)."""

    Params = AdapterResidencyParams

    def __init__(self, params: AdapterResidencyParams, **kw: object) -> None:
        super().__init__(params, **kw)  # type: ignore[arg-type]
        self._gpu: dict[str, _Lru] = {}
        self._host: dict[str, _Lru] = {}
        self._rate: dict[str, float] = {}  # adapter -> decayed new sessions per second
        self._at = 0.0
        self._unloaded: dict[tuple[str, str], float] = {}  # -> when: no pre-load back there for a while
        self._plan_s = 0.0
        p = self.params
        self.replica_demand = ReplicaDemand(UnloadRule(
            half_life_s=p.unload_half_life_s, pin_window_s=p.unload_pin_window_s,
            session_weight=p.unload_session_weight, max_per_plan=p.max_unloads))

    # ---------------------------------------------------------------- scoring
    def score(self, state: CycleState) -> np.ndarray:
        adapter = state.request.adapter
        if not adapter:
            return np.zeros(len(state.sel))
        return np.array([self._score(state.view(int(i)).name, adapter) for i in state.sel], dtype=np.float64)

    def _score(self, replica: str, adapter: str) -> float:
        tier = self.where(replica, adapter)
        if tier == "gpu":
            return self.params.gpu_score
        if tier == "host":
            return self.params.host_score
        return 0.0

    def where(self, replica: str, adapter: str) -> Tier | None:
        """Where the mirror puts ``adapter``'s weights on ``replica`` (``AdapterWarmth``)."""
        gpu, host = self._gpu.get(replica), self._host.get(replica)
        if gpu is not None and adapter in gpu.names:
            return "gpu"
        if host is not None and adapter in host.names:
            return "host"
        return None

    def bind(self, handle: Handle) -> None:
        """Offer the mirror to the latency model's adapter load times."""
        super().bind(handle)
        handle.adapter_warmth = self

    def placed(self, state: CycleState | OneCandidate, view: ReplicaView, decision: Decision) -> None:
        adapter = state.request.adapter
        if not adapter:
            return
        self._gpu.setdefault(view.name, _Lru(1)).touch(adapter, view.max_loras or 1)
        self._host.setdefault(view.name, _Lru(self.params.host_slots)).touch(adapter)
        if self.params.unload:
            self.replica_demand.placed(view.name, adapter, state.request.session_id or state.request.task_id,
                                       state.now_s)
        if isinstance(state, CycleState):  # a free choice of replica: a new session (or a moved one)
            self._decay(state.now_s)
            self._rate[adapter] = self._rate.get(adapter, 0.0) + 1.0 / self._window()

    def replica_removed(self, replica: str) -> None:
        self._gpu.pop(replica, None)
        self._host.pop(replica, None)
        self.replica_demand.forget(replica)

    def task_ended(self, session: str) -> None:
        self.replica_demand.ended(session)

    def replica_failed(self, replica: str) -> int:
        self.replica_removed(replica)
        return 0

    # ---------------------------------------------------------------- demand and pre-loads
    def _window(self) -> float:
        return self.params.half_life_s / math.log(2.0)  # the decayed sum's time constant

    def _decay(self, now_s: float) -> None:
        if now_s > self._at:
            f = math.exp(-(now_s - self._at) / self._window())
            self._rate = {a: r * f for a, r in self._rate.items() if r * f > 1e-6}
            self._at = now_s

    def demand(self, now_s: float) -> dict[str, float]:
        """Each adapter's predicted new sessions per second."""
        self._decay(now_s)
        return dict(self._rate)

    def holders(self, adapter: str) -> list[str]:
        return [r for r, lru in self._host.items() if adapter in lru.names]

    def plan(self, views: list[ReplicaView], now_s: float, *, prior: bool = True) -> list[tuple[str, str]]:
        """(replica, adapter) pre-loads: hot adapters on too few replicas, each onto the least
        busy healthy replica that lacks it and whose host copies are all colder. ``prior``:
        adapters the fleet serves whose sessions were not seen yet get one holder too (the
        live loader leaves that to the operator's registrations)."""
        p: AdapterResidencyParams = self.params
        rate = self.demand(now_s)
        for v in views if prior else ():  # every adapter the fleet serves gets a holder, the ones seen first
            for adapter in sorted(v.lora_served or ()):  # in name order: runs repeat
                rate.setdefault(adapter, p.prior_rate)
        able = [v for v in views if v.healthy and v.max_loras > 0 and v.num_running <= p.preload_max_running]
        out: list[tuple[str, str]] = []
        for adapter, r in sorted(rate.items(), key=lambda kv: (-kv[1], kv[0])):
            want = min(len(views), max(1, math.ceil(r / p.sessions_per_holder)))
            have = set(self.holders(adapter))
            if len(have) >= want:
                continue
            spots = [v for v in able if v.name not in have and self._room_for(v.name, r, rate)
                     and now_s - self._unloaded.get((v.name, adapter), -math.inf) >= p.unload_pin_window_s]
            if not spots:
                continue
            best = min(spots, key=lambda v: (v.num_running + v.num_waiting, v.name))
            out.append((best.name, adapter))
            able.remove(best)
            if len(out) >= p.max_preloads:
                break
        return out

    def _room_for(self, replica: str, r: float, rate: dict[str, float]) -> bool:
        """A free host slot there, or its coldest copy colder than this adapter."""
        host = self._host.get(replica)
        if host is None or len(host.names) < host.cap:
            return True
        coldest = next(iter(host.names))
        return rate.get(coldest, 0.0) < r

    def preloaded(self, replica: str, adapter: str) -> None:
        """The planner loaded ``adapter``'s host copy on ``replica``."""
        self._host.setdefault(replica, _Lru(self.params.host_slots)).touch(adapter)

    def unloads(self, views: list[ReplicaView], now_s: float) -> list[tuple[str, str]]:
        """(replica, adapter) unloads by predicted demand (none unless ``unload``): see
        ``adapter_demand.ReplicaDemand.plan_unloads``."""
        if not self.params.unload:
            return []
        self._plan_s = now_s
        return self.replica_demand.plan_unloads(views, now_s)

    def unloaded(self, replica: str, adapter: str) -> None:
        """The planner unloaded ``adapter`` on ``replica``: its copies and demand there are gone."""
        for mirror in (self._gpu.get(replica), self._host.get(replica)):
            if mirror is not None:
                mirror.names.pop(adapter, None)
        self.replica_demand.forget(replica, adapter)
        self._unloaded[(replica, adapter)] = self._plan_s


def find_planner(policy: Any) -> Any | None:
    """The plugin of ``policy``'s pipeline that plans adapter loads (``plan``, ``preloaded``)
    with ``preload`` on, if any: ``adapter-residency``, ``adapter-binding`` (through flow
    control and the bench's timing wrappers)."""
    while getattr(policy, "inner", None) is not None:
        policy = policy.inner
    pipeline = getattr(policy, "pipeline", policy)
    for plugin in getattr(pipeline, "scorers", ()):
        if callable(getattr(plugin, "plan", None)) and callable(getattr(plugin, "preloaded", None)) \
                and getattr(getattr(plugin, "params", None), "preload", False):
            return plugin
    return None
