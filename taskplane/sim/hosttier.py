"""KV tiers below GPU memory: a replica's host (CPU DRAM) store and a shared remote store.

Modelled on vLLM's native CPU offloading (``OffloadingConnector`` with the CPU backend,
``LRUOffloadingManager``): every block the GPU cache stores is also written to host memory
(write-through, as the connector stores computed blocks), the host store evicts least
recently used blocks, a lookup that hits host blocks touches them, and the connector
publishes its changes as KV events with ``medium="CPU"`` (``BlockStored`` with the engine's
block hashes, no token ids and no parent; ``BlockRemoved``). A remote store (LMCache /
Mooncake Store style) is the same LRU shared by every replica, at network bandwidth; it
publishes no events (it is no replica's medium).

A hit in a tier is *loaded* into fresh GPU blocks at the tier's bandwidth instead of being
recomputed; the engine adds the transfer time to the step that admits the request (the
load competes with compute on the replica).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from taskplane.scheduler.kv.events import BlockRemoved, BlockStored, KVEvent
from taskplane.sim.gpus import model_profile

MEDIUM_CPU = "CPU"
#: effective host<->device bandwidth of a PCIe Gen5 x16 link (64 GB/s peak; vLLM's offloading
#: blog measures tens of GB/s for large block transfers)
PCIE_BYTES_PER_S = 40e9
#: a 100 Gb/s network link to a remote KV store
NETWORK_BYTES_PER_S = 12.5e9


@dataclass(frozen=True, slots=True)
class TierSpec:
    """The KV tiers every replica of a simulated fleet gets (``bench --host-kv-gb``)."""

    host_kv_gb: float = 0.0  # per replica
    remote_kv_gb: float = 0.0  # shared by the fleet
    pcie_bytes_per_s: float = PCIE_BYTES_PER_S
    network_bytes_per_s: float = NETWORK_BYTES_PER_S

    @property
    def enabled(self) -> bool:
        return self.host_kv_gb > 0 or self.remote_kv_gb > 0

    def blocks(self, gb: float, model: str, block_size: int) -> int:
        """How many KV blocks of ``model`` fit in ``gb`` gigabytes."""
        return int(gb * 1e9 // (model_profile(model).kv_bytes_per_token * block_size))


class TierStore:
    """An LRU set of block hashes with a capacity: one host store, or the remote store."""

    __slots__ = ("blocks", "capacity", "emit", "events", "medium", "removed", "stored")

    def __init__(self, capacity_blocks: int, *, medium: str = MEDIUM_CPU, emit_events: bool = True) -> None:
        if capacity_blocks < 1:
            raise ValueError("a tier needs at least one block")
        self.capacity = capacity_blocks
        self.medium = medium
        self.emit = emit_events
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.events: list[KVEvent] = []
        self.stored = 0  # blocks written (offloaded) so far
        self.removed = 0  # blocks evicted so far

    def put(self, hashes: Iterable[int], block_size: int) -> int:
        """Write ``hashes`` (blocks the GPU just stored); returns how many were new."""
        blocks = self.blocks
        new: list[int] = []
        for h in hashes:
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
                new.append(h)
        if not new:
            return 0
        self.stored += len(new)
        evicted: list[int] = []
        while len(blocks) > self.capacity:
            evicted.append(blocks.popitem(last=False)[0])
        self.removed += len(evicted)
        if self.emit:
            self.events.append(BlockStored(block_hashes=new, parent_block_hash=None, token_ids=[],
                                           block_size=block_size, medium=self.medium))
            if evicted:
                self.events.append(BlockRemoved(block_hashes=evicted, medium=self.medium))
        return len(new)

    def match(self, hashes: Sequence[int], start: int, limit: int) -> int:
        """How many of ``hashes[start:limit]``, from ``start`` on, the tier holds in a row;
        those are touched (most recently used), as vLLM's lookup + touch."""
        blocks = self.blocks
        n = 0
        for j in range(start, min(limit, len(hashes))):
            h = hashes[j]
            if h not in blocks:
                break
            blocks.move_to_end(h)
            n += 1
        return n

    def clear(self) -> None:
        self.blocks.clear()

    def take_events(self) -> list[KVEvent]:
        ev = self.events
        self.events = []
        return ev


@dataclass(slots=True)
class TierStats:
    """Tokens served from and moved between tiers on one replica."""

    host_hit_tokens: int = 0  # prompt tokens loaded from host memory instead of recomputed
    remote_hit_tokens: int = 0  # ... from the remote store
    loaded_tokens: int = 0  # host/remote -> GPU
    offloaded_tokens: int = 0  # GPU -> host (write-through)
    prefetched_tokens: int = 0  # host/remote -> GPU ahead of a call (part of loaded_tokens)
    load_s: float = 0.0  # transfer time added to steps


class ReplicaTiers:
    """One replica's view of the tiers: its host store, the shared remote store, bandwidths."""

    __slots__ = ("block_bytes", "block_size", "host", "net_bw", "pcie_bw", "remote", "stats")

    def __init__(self, *, host: TierStore | None, remote: TierStore | None, block_size: int, block_bytes: int,
                 pcie_bytes_per_s: float = PCIE_BYTES_PER_S,
                 network_bytes_per_s: float = NETWORK_BYTES_PER_S) -> None:
        self.host = host
        self.remote = remote
        self.block_size = block_size
        self.block_bytes = block_bytes
        self.pcie_bw = pcie_bytes_per_s
        self.net_bw = network_bytes_per_s
        self.stats = TierStats()

    def spill(self, hashes: list[int]) -> None:
        """The GPU cache stored ``hashes``: write them through to the tiers."""
        if self.host is not None:
            self.stats.offloaded_tokens += self.host.put(hashes, self.block_size) * self.block_size
        if self.remote is not None:
            self.remote.put(hashes, self.block_size)

    def depth(self, hashes: Sequence[int], start: int, limit: int) -> int:
        """How many blocks past ``start`` the tiers hold in a row (nothing is touched)."""
        n = start
        limit = min(limit, len(hashes))
        for store in (self.host, self.remote):
            if store is not None:
                blocks = store.blocks
                while n < limit and hashes[n] in blocks:
                    n += 1
        return n - start

    def load(self, hashes: Sequence[int], start: int, limit: int, *, prefetch: bool = False) -> tuple[int, float]:
        """Blocks past the GPU hit (``start``) found in the tiers, host first then remote,
        and the seconds their transfer to the GPU takes. ``prefetch``: ahead of the call
        (counted as prefetched, not as a hit: the call will hit them on GPU)."""
        n_host = self.host.match(hashes, start, limit) if self.host is not None else 0
        n_rem = self.remote.match(hashes, start + n_host, limit) if self.remote is not None else 0
        n = n_host + n_rem
        if not n:
            return 0, 0.0
        secs = self.block_bytes * (n_host / self.pcie_bw + n_rem / self.net_bw)
        st, bs = self.stats, self.block_size
        if prefetch:
            st.prefetched_tokens += n * bs
        else:
            st.host_hit_tokens += n_host * bs
            st.remote_hit_tokens += n_rem * bs
        st.loaded_tokens += n * bs
        st.load_s += secs
        return n, secs

    def take_events(self) -> list[KVEvent]:
        return self.host.take_events() if self.host is not None and self.host.events else []

    def reset(self) -> None:
        """An engine restart empties its host memory (not the remote store)."""
        if self.host is not None:
            self.host.clear()
