"""The cluster simulator's fleet: one engine per replica and the view a policy reads of it.

A policy call must see every replica as it is at that moment, but copying every engine's
state before every call would cost O(replicas) each. So a replica whose engine changed is
marked, and only marked views are refreshed. A FlowControl also gets the fleet as a
:class:`~taskplane.scheduler.table.ReplicaTable` (numpy columns it scores in bulk); its
rows are rewritten only before the policy reads them, so a replica that changes several
times between two policy calls has its row written once.
"""

from __future__ import annotations

from typing import Any

from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.types import ReplicaView
from taskplane.sim.engine import EngineConfig, SimEngine
from taskplane.sim.fleet import ClusterSpec
from taskplane.sim.gpus import model_profile
from taskplane.sim.hosttier import ReplicaTiers, TierSpec, TierStore
from taskplane.sim.results import ReplicaResult


class SimReplicas:
    """The engines, prices, health and policy-facing views of a simulated fleet."""

    def __init__(self, cluster: ClusterSpec, block_size: int, *, kv_events: bool, table: bool,
                 first_tokens: bool = False) -> None:
        self.engines: list[SimEngine] = []
        self.views: list[ReplicaView] = []
        self.prices: list[float] = []
        self._index: dict[str, int] = {}
        spec = cluster.tiers
        remote = None
        if spec.remote_kv_gb > 0 and cluster.replicas:
            m = cluster.replicas[0].model
            remote = TierStore(spec.blocks(spec.remote_kv_gb, m, block_size), medium="REMOTE", emit_events=False)
        for i, r in enumerate(cluster.replicas):
            if r.name in self._index:
                raise ValueError(f"duplicate replica name {r.name!r}")
            self._index[r.name] = i
            eng = SimEngine(EngineConfig(
                gpu=r.gpu, model=r.model, kv_blocks=r.kv_blocks, block_size=block_size, max_num_seqs=r.max_num_seqs,
                max_num_batched_tokens=r.max_num_batched_tokens, model_loaded=r.model_loaded,
                cold_start_s=r.cold_start_s, emit_kv_events=kv_events, emit_first_token=first_tokens,
                removed_per_block=False, lora=r.lora), tiers=_tiers(spec, remote, r.model, block_size, kv_events))
            for adapter in r.adapters:
                eng.adapters.register(adapter, f"/adapters/{adapter}")  # type: ignore[union-attr]
            price = r.cost_per_hour_usd if r.cost_per_hour_usd is not None else eng.gpu.price_per_hour_usd
            self.engines.append(eng)
            self.prices.append(price)
            self.views.append(ReplicaView(
                name=r.name, model=r.model, gpu=r.gpu, cost_per_hour_usd=price, healthy=True,
                model_loaded=r.model_loaded, kv_blocks_total=eng.num_blocks, kv_blocks_free=eng.free_blocks(),
                block_size=block_size, has_kv_events=kv_events, max_num_seqs=r.max_num_seqs,
                kv_host_blocks_total=eng.tiers.host.capacity if eng.tiers is not None and eng.tiers.host is not None else 0,
                max_loras=r.lora.max_loras if r.lora is not None else 0,
                # the adapters registered at start: what the replica's /v1/models lists
                lora_served=frozenset(r.adapters) if r.lora is not None else None, role=r.role,
                models_asleep=frozenset(r.hosted()[1:]), sleep_level=r.sleep_level))
        self.healthy = [True] * len(self.engines)
        # calls held at a replica for a model swap: (calls, prompt tokens), counted as waiting there
        self.held: dict[int, tuple[int, int]] = {}
        self._table = ReplicaTable(self.views) if table else None
        self._dirty: set[int] = set()  # replicas whose engine changed since their view was set
        self._unsynced: set[int] = set()  # replicas whose view changed since their table row was written

    def __len__(self) -> int:
        return len(self.engines)

    def find(self, name: str | None) -> int | None:
        """The index of the replica named ``name``."""
        return self._index.get(name or "")

    def name(self, i: int) -> str:
        return self.views[i].name

    def mark(self, i: int) -> None:
        """Replica ``i``'s engine (or health) changed: its view is stale."""
        self._dirty.add(i)

    def snapshot(self) -> None:
        """Copy the changed replicas' engine state into their views: the state a policy
        call at this moment would see (their table rows wait for :meth:`for_policy`)."""
        dirty = self._dirty
        if not dirty:
            return
        engines, views, healthy = self.engines, self.views, self.healthy
        for i in dirty:
            e, v = engines[i], views[i]
            (v.num_running, v.num_waiting, v.kv_blocks_free, v.inflight_prefill_tokens,
             v.inflight_decode_tokens) = e.load()
            v.model_loaded = e.model_loaded
            v.healthy = healthy[i]
            if self.held:
                calls, tokens = self.held.get(i, (0, 0))
                v.num_waiting += calls
                v.inflight_prefill_tokens += tokens
            if e.adapters is not None:
                v.lora_running, v.lora_waiting = lora_state(e)
        if self._table is not None:
            self._unsynced |= dirty
        dirty.clear()

    def for_policy(self) -> Any:
        """The fleet, up to date, as the policy reads it (the table, or the list of views)."""
        self.snapshot()
        if self._table is None:
            return self.views
        unsynced = self._unsynced
        if unsynced:
            upsert, views = self._table.upsert, self.views
            for i in unsynced:
                upsert(views[i])
            unsynced.clear()
        return self._table

    def results(self) -> list[ReplicaResult]:
        return [ReplicaResult(name=v.name, gpu=v.gpu, cost_per_hour_usd=self.prices[i],
                              busy_s=e.stats.busy_s, steps=e.stats.steps, prefix_queries=e.stats.prefix_queries,
                              prefix_hits=e.stats.prefix_hits, finished=e.stats.finished,
                              **_tier_figures(e), **_lora_figures(e))
                for i, (v, e) in enumerate(zip(self.views, self.engines, strict=True))]


def _tiers(spec: TierSpec, remote: TierStore | None, model: str, block_size: int,
           kv_events: bool) -> ReplicaTiers | None:
    """One replica's KV tiers from the fleet's :class:`TierSpec` (None: GPU only)."""
    if not spec.enabled:
        return None
    host = None
    if spec.host_kv_gb > 0:
        host = TierStore(spec.blocks(spec.host_kv_gb, model, block_size), emit_events=kv_events)
    return ReplicaTiers(host=host, remote=remote, block_size=block_size,
                        block_bytes=model_profile(model).kv_bytes_per_token * block_size,
                        pcie_bytes_per_s=spec.pcie_bytes_per_s, network_bytes_per_s=spec.network_bytes_per_s)


def _tier_figures(engine: SimEngine) -> dict[str, int]:
    """A replica's tier counters for its :class:`ReplicaResult` (none without tiers)."""
    if engine.tiers is None:
        return {}
    st = engine.tiers.stats
    return {"host_hit_tokens": st.host_hit_tokens, "remote_hit_tokens": st.remote_hit_tokens,
            "loaded_tokens": st.loaded_tokens, "offloaded_tokens": st.offloaded_tokens,
            "prefetched_tokens": st.prefetched_tokens}


def lora_state(engine: SimEngine) -> tuple[frozenset[str], frozenset[str]]:
    """The adapters of its running and of its waiting requests: what a replica's
    ``vllm:lora_requests_info`` reports, nothing more (not its GPU or host copies)."""
    running = frozenset(engine.adapters.running) if engine.adapters is not None else frozenset()
    waiting = frozenset(r.spec.adapter for r in engine.batcher.waiting if r.spec.adapter)
    return running, waiting


def _lora_figures(engine: SimEngine) -> dict[str, int]:
    """A replica's adapter load counters for its :class:`ReplicaResult` (none without LoRA)."""
    a = engine.adapters
    return {} if a is None else {"lora_disk_loads": a.loads_from_disk, "lora_gpu_loads": a.loads_to_gpu,
                                "lora_preloads": a.preloads, "lora_unloads": a.unloads}
