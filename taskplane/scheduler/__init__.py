"""The pure scheduling core: state in, decision out. Imports nothing of gateway, store,
engines or sim, so the live gateway and the virtual-time simulator run the same code.

Entry point: ``build_policy(name_or_config, seed=...)``; see docs/scheduler.md.

The names below are loaded on first use (PEP 562), so a light import such as
``taskplane.scheduler.types`` (the SDK's ``Priority``) does not pull in numpy and the
whole pipeline.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "AdmissionSettings": "taskplane.scheduler.flowcontrol.settings",
    "check_priority_cap": "taskplane.scheduler.flowcontrol.settings",
    "FlowControl": "taskplane.scheduler.flowcontrol.controller",
    "Scheduler": "taskplane.scheduler.core",
    "ROOT": "taskplane.scheduler.hashing",
    "chain_hashes": "taskplane.scheduler.hashing",
    "text_chain_hashes": "taskplane.scheduler.hashing",
    "BatchResult": "taskplane.scheduler.kv.precise",
    "BatchStatus": "taskplane.scheduler.kv.precise",
    "KVIndex": "taskplane.scheduler.kvindex",
    "LatencyModel": "taskplane.scheduler.latency",
    "PRESETS": "taskplane.scheduler.policies",
    "build_policy": "taskplane.scheduler.policies",
    "build_scheduler": "taskplane.scheduler.policies",
    "policy_names": "taskplane.scheduler.policies",
    "ResponseCache": "taskplane.scheduler.response_cache",
    "cache_key": "taskplane.scheduler.response_cache",
    "Action": "taskplane.scheduler.types",
    "CallOutcome": "taskplane.scheduler.types",
    "CallRequest": "taskplane.scheduler.types",
    "Decision": "taskplane.scheduler.types",
    "Priority": "taskplane.scheduler.types",
    "ReplicaView": "taskplane.scheduler.types",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'taskplane.scheduler' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
