"""LoRA adapters on the simulated replica, after vLLM's LoRA manager (``--enable-lora``).

What is modelled:

- **Registered adapters** (``--lora-modules`` at start, ``POST /v1/load_lora_adapter`` at
  run time): a name and a path, each with vLLM's integer id (``lora_int_id``, from 1).
  Registering reads nothing yet; a request names the adapter as its ``model``.
- **Two caches of weights**: ``max_cpu_loras`` adapters in host memory and ``max_loras``
  GPU slots, each least recently used first out. The step that first schedules a request of
  an adapter that is not in a GPU slot pays its load: ``gpu_load_s`` from host memory, plus
  ``disk_load_s`` when it must first be read from disk (vLLM loads synchronously in the
  model runner, so the whole batch waits).
- **The batch limit**: a step may use at most ``max_loras`` distinct adapters. A waiting
  request of another adapter is skipped (it keeps its place; later requests may go), as
  vLLM's scheduler does.
- **The batch slowdown**: a step with LoRA requests costs ``1 + step_overhead +
  per_adapter_overhead x distinct adapters`` times the base model's step (the punica/SGMV
  kernels' extra work grows with the adapters a batch mixes).
- **KV**: vLLM folds the adapter into every block hash, so blocks of different adapters
  (and of the base model) never match; the replica's hashes do the same (``hash_root``).

The load times and slowdowns are a model, not a measurement of any GPU: see docs/sim.md.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass


class LoraError(ValueError):
    """A LoRA API request vLLM would refuse (the message is vLLM's)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, kw_only=True, slots=True)
class LoraSettings:
    """vLLM's LoRA engine arguments and the simulator's cost model of them."""

    max_loras: int = 1  # --max-loras: GPU slots, and distinct adapters per batch
    max_cpu_loras: int | None = None  # --max-cpu-loras: adapters kept in host memory (None: max_loras)
    max_lora_rank: int = 16  # --max-lora-rank: only reported
    disk_load_s: float = 0.25  # reading one adapter's weights from disk into host memory
    gpu_load_s: float = 0.005  # copying them from host memory into a GPU slot
    step_overhead: float = 0.05  # a step with any LoRA request is this much slower ...
    per_adapter_overhead: float = 0.02  # ... plus this per distinct adapter it mixes

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError("max_loras must be at least 1")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})")

    @property
    def cpu_slots(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras


@dataclass(frozen=True, slots=True)
class Adapter:
    name: str
    path: str
    int_id: int


class Adapters:
    """The adapters one replica knows, the host and GPU copies of their weights, and the
    counters its metrics and the LoRA API report."""

    def __init__(self, settings: LoraSettings) -> None:
        self.settings = settings
        self.registered: dict[str, Adapter] = {}
        self._next_id = 1
        self._cpu: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._gpu: OrderedDict[str, None] = OrderedDict()
        self.running: dict[str, int] = {}  # adapter -> requests of it in the batch (prefilling or decoding)
        self.loads_from_disk = 0
        self.loads_to_gpu = 0
        self.preloads = 0  # host copies read ahead of demand (``preload``), off the request path
        self.unloads = 0  # adapters unregistered at run time (``unregister``)
        self._busy_until = 0.0  # a pre-load's read holds the engine until then

    # ---------------------------------------------------------------- the LoRA API
    def register(self, name: str, path: str) -> Adapter:
        if not name or not path:
            raise LoraError(400, "Both 'lora_name' and 'lora_path' must be provided.")
        if name in self.registered:
            raise LoraError(400, f"The lora adapter '{name}' has already been loaded.")
        adapter = Adapter(name, path, self._next_id)
        self._next_id += 1
        self.registered[name] = adapter
        return adapter

    def unregister(self, name: str) -> None:
        if name not in self.registered:
            raise LoraError(404, f"The lora adapter '{name}' cannot be found.")
        if self.running.get(name):
            raise LoraError(400, f"The lora adapter '{name}' is in use by running requests.")
        del self.registered[name]
        self._cpu.pop(name, None)
        self._gpu.pop(name, None)
        self.unloads += 1

    def preload(self, name: str, now_s: float) -> bool:
        """Read a registered adapter's weights into host memory ahead of its requests (what
        vLLM's ``add_lora`` does when ``/v1/load_lora_adapter`` registers one); False when
        it is unknown or already there. The read is synchronous in the engine, as a load on
        the request path is: the engine's next step waits until it ends (``stall``)."""
        if name not in self.registered or name in self._cpu:
            return False
        self._cpu[name] = None
        while len(self._cpu) > self.settings.cpu_slots:
            self._evict(self._cpu, keep=name)
        self.preloads += 1
        self._busy_until = max(self._busy_until, now_s) + self.settings.disk_load_s
        return True

    def stall(self, t0: float) -> float:
        """The seconds a step starting at ``t0`` waits for pre-load reads still under way."""
        wait = max(0.0, self._busy_until - t0)
        self._busy_until = min(self._busy_until, t0)
        return wait

    # ---------------------------------------------------------------- scheduling
    def can_join(self, name: str, scheduled: set[str]) -> bool:
        """May a request of ``name`` join a batch already using ``scheduled``?"""
        return name in scheduled or len(scheduled) < self.settings.max_loras

    def activate(self, name: str) -> float:
        """``name`` is in the step about to run: put it in a GPU slot; the seconds that costs."""
        if name in self._gpu:
            self._gpu.move_to_end(name)
            if name in self._cpu:
                self._cpu.move_to_end(name)
            return 0.0
        s = self.settings
        seconds = s.gpu_load_s
        if name in self._cpu:
            self._cpu.move_to_end(name)
        else:
            seconds += s.disk_load_s
            self.loads_from_disk += 1
            self._cpu[name] = None
            while len(self._cpu) > s.cpu_slots:
                self._evict(self._cpu, keep=name)
        self._gpu[name] = None
        self.loads_to_gpu += 1
        while len(self._gpu) > s.max_loras:
            self._evict(self._gpu, keep=name)
        return seconds

    def _evict(self, cache: OrderedDict[str, None], keep: str) -> None:
        """The least recently used adapter not in the batch leaves ``cache``."""
        for victim in cache:
            if victim != keep and not self.running.get(victim):
                del cache[victim]
                return
        for victim in cache:  # every one in use: the oldest goes (its requests keep their copy)
            if victim != keep:
                del cache[victim]
                return

    def joined(self, name: str) -> None:
        self.running[name] = self.running.get(name, 0) + 1

    def left(self, name: str) -> None:
        n = self.running.get(name, 0) - 1
        if n > 0:
            self.running[name] = n
        else:
            self.running.pop(name, None)

    def slowdown(self) -> float:
        """The step-time factor of the batch's adapters (1.0 without any)."""
        n = len(self.running)
        if not n:
            return 1.0
        return 1.0 + self.settings.step_overhead + self.settings.per_adapter_overhead * n

    # ---------------------------------------------------------------- reporting
    @property
    def on_gpu(self) -> list[str]:
        return list(self._gpu)

    @property
    def in_cpu(self) -> list[str]:
        return list(self._cpu)


def parse_lora_modules(specs: list[str]) -> tuple[tuple[str, str], ...]:
    """``--lora-modules`` values, ``NAME=PATH`` each (vLLM's plain form), as pairs."""
    out = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"--lora-modules wants NAME=PATH, got {spec!r}")
        out.append((name.strip(), path.strip()))
    return tuple(out)


def hash_root(root: int, adapter: Adapter | None) -> int:
    """The block-hash chain's root for requests of ``adapter`` (``root`` for the base model):
    as in vLLM, an adapter's blocks never match another's or the base model's."""
    if adapter is None:
        return root
    digest = hashlib.blake2b(root.to_bytes(8, "little") + adapter.int_id.to_bytes(8, "little"), digest_size=8,
                             person=b"tp-simlora").digest()
    return int.from_bytes(digest, "little")
