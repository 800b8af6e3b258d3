"""LoRA on the dev stack's replicas: vLLM's flags, passed to every simulated replica.

``taskplane dev up --enable-lora [--max-loras N] [--max-cpu-loras N] [--lora-modules
NAME=PATH]...`` starts each replica as ``vllm serve`` would with those flags: every adapter
of ``--lora-modules`` registered on every replica. With ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=true``
in the environment of ``dev up`` the replicas also serve ``POST /v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``, so an operator (or the gateway's adapter loader) registers an
adapter on some replicas only; the gateway reads each replica's ``/v1/models`` and places an
adapter's calls where it is registered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from taskplane.errors import UserError


@dataclass(frozen=True, kw_only=True)
class DevLora:
    """The LoRA flags of ``dev up`` (None of it when LoRA is off)."""

    max_loras: int = 1  # --max-loras: GPU slots, and adapters one batch may mix
    max_cpu_loras: int | None = None  # --max-cpu-loras: adapters kept in host memory (None: max_loras)
    modules: tuple[tuple[str, str], ...] = ()  # --lora-modules NAME=PATH, registered on every replica

    @classmethod
    def from_flags(cls, enable: bool, max_loras: int, max_cpu_loras: int | None,
                   modules: Sequence[str]) -> DevLora | None:
        """The flags as given, checked; None without ``--enable-lora``."""
        if not enable:
            if modules:
                raise UserError("--lora-modules needs --enable-lora (as vLLM's does)")
            return None
        if max_cpu_loras is not None and max_cpu_loras < max_loras:
            raise UserError(f"--max-cpu-loras ({max_cpu_loras}) must be at least --max-loras ({max_loras})")
        pairs = tuple(_module(spec) for spec in modules)
        names = [n for n, _ in pairs]
        if len(set(names)) != len(names):
            raise UserError(f"--lora-modules names an adapter twice: {sorted(names)}")
        return cls(max_loras=max_loras, max_cpu_loras=max_cpu_loras, modules=pairs)

    def replica_args(self) -> list[str]:
        """``taskplane sim-engine`` flags (vLLM's names)."""
        args = ["--enable-lora", "--max-loras", str(self.max_loras)]
        if self.max_cpu_loras is not None:
            args += ["--max-cpu-loras", str(self.max_cpu_loras)]
        for name, path in self.modules:
            args += ["--lora-modules", f"{name}={path}"]
        return args

    def record(self) -> dict[str, Any]:
        """What ``dev status --json`` shows under ``lora``."""
        out = asdict(self)
        out["modules"] = [{"name": n, "path": p} for n, p in self.modules]
        return out


def _module(spec: str) -> tuple[str, str]:
    """One ``--lora-modules`` value, ``NAME=PATH`` (vLLM's plain form)."""
    name, sep, path = spec.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise UserError(f"--lora-modules wants NAME=PATH, got {spec!r}")
    return name.strip(), path.strip()
