"""The pure scheduling core: state in, decision out. Imports nothing of gateway, store,
engines or sim, so the live gateway and the virtual-time simulator run the same code.

Entry point: ``build_policy(name_or_config, seed=...) -> Scheduler``; see docs/scheduler.md.
"""

from taskplane.scheduler.admission import AdmissionSettings, check_priority_cap
from taskplane.scheduler.core import Scheduler
from taskplane.scheduler.hashing import ROOT, chain_hashes, text_chain_hashes
from taskplane.scheduler.kvindex import BatchResult, BatchStatus, KVIndex
from taskplane.scheduler.latency import LatencyModel
from taskplane.scheduler.policies import PRESETS, build_policy, build_scheduler, policy_names
from taskplane.scheduler.response_cache import ResponseCache, cache_key
from taskplane.scheduler.types import Action, CallOutcome, CallRequest, Decision, ReplicaView

__all__ = [
    "PRESETS",
    "ROOT",
    "Action",
    "AdmissionSettings",
    "BatchResult",
    "BatchStatus",
    "CallOutcome",
    "CallRequest",
    "Decision",
    "KVIndex",
    "LatencyModel",
    "ReplicaView",
    "ResponseCache",
    "Scheduler",
    "build_policy",
    "build_scheduler",
    "cache_key",
    "chain_hashes",
    "check_priority_cap",
    "policy_names",
    "text_chain_hashes",
]
