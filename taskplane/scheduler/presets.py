"""Named placement policies: each a configuration of the same pipeline and flow control.

The baselines reproduce the published rule of each system as closely as plain replica
state allows; docs/scheduler.md gives each rule and its source.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    summary: str  # the rule, in one sentence
    source: str  # where the rule comes from
    filters: tuple[Any, ...] = ("healthy",)
    scorers: tuple[Any, ...] = ()
    picker: Any = "max-score"
    admission: bool = False
    sticky: bool = False  # a pinned session's call is decided over its replica first
    # KV lifetimes across tool gaps (keep / host + prefetch / drop: scheduler/kv/lifetimes.py),
    # carried out where KV tiers exist (the simulator)
    kv_lifetimes: bool = False
    # prefill/decode disaggregation (scheduler/disagg): {"decider": spec, "filters": [...],
    # "scorers": [...], "picker": spec}, the prefill profile run over prefill-role replicas
    # after the call's decode replica is chosen; it does nothing on a fleet without them
    disaggregation: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _s(type_name: str, weight: float = 1.0, **params: Any) -> dict[str, Any]:
    return {"type": type_name, "weight": weight, "params": params}


#: the prefill profile of taskplane's own disaggregation: where the prefix already is, then the least
#: prefill work queued ahead (predicted latency), then memory
_TASKPLANE_PD = {
    "decider": {"type": "agent-pd"},
    "filters": ("healthy", "tenant-gpu", "memory-headroom"),
    "scorers": (_s("tiered-prefix", 3.0), _s("latency", 2.0), _s("memory-headroom", 1.0)),
}

_TASKPLANE_FILTERS = ("healthy", "swap-gate", "tenant-gpu", "adapter-served", "memory-headroom", "latency-budget", "prefill-finish", "load-balance")
_TASKPLANE_SCORERS = (
    _s("tiered-prefix", 3.0),
    _s("session-affinity", 2.0, predict_end=True),
    _s("latency", 2.0),
    _s("memory-headroom", 1.0),
    _s("weight-warmth", 1.0),
    _s("gpu-price", 1.0),
    _s("workflow-context", 1.0),
    _s("adapter-affinity", 8.0),
    _s("adapter-residency", 8.0, preload=True, preload_max_running=0, sessions_per_holder=1.0),
)

_TASKPLANE = Preset(
    "taskplane",
    "all seven axes: filters (health, a swap to a model hosted asleep only when it pays, tenant GPUs, the call's adapter registered, memory headroom, latency budget, long prefills by "
    "when they would finish, load balance), scorers "
    "(prefix 3, session pin 2, predicted latency 2, memory 1, warmth 1, price 1, workflow 1, "
    "LoRA adapter affinity and residency 8), "
    "admission control with priority bands, fair share, EDF and shedding; on a fleet with "
    "prefill-role replicas, taskplane-pd's disaggregation",
    "this project",
    filters=_TASKPLANE_FILTERS,
    scorers=_TASKPLANE_SCORERS,
    admission=True,
    sticky=True,
    kv_lifetimes=True,
    disaggregation=_TASKPLANE_PD,
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "round-robin",
            "the next healthy replica in turn",
            "the classic load-balancer default (e.g. Kubernetes Service / nginx upstream)",
            picker="round-robin",
        ),
        Preset(
            "least-loaded",
            "fewest running + waiting requests; ties broken by the seed",
            "least-request load balancing (Envoy LEAST_REQUEST, vLLM production-stack)",
            scorers=(_s("least-loaded"),),
        ),
        Preset(
            "session-hash",
            "consistent hashing of the session id (else task id) on a ring with 100 virtual nodes per replica",
            "session affinity by consistent hashing (vLLM production-stack session router, Envoy ring hash)",
            picker="consistent-hash",
        ),
        Preset(
            "sglang-cache-aware",
            "if max-min load > 64 and max > 1.5x min: shortest queue; else the best prefix match "
            "if its match ratio > 0.3; else the least loaded; prefixes from the router's own routing history",
            "SGLang router, cache_aware policy (sgl-router; balance_abs_threshold=64, "
            "balance_rel_threshold=1.5, cache_threshold=0.3)",
            picker={"type": "sglang-cache-aware"},
        ),
        Preset(
            "llm-d-scorers",
            "weighted sum of prefix-cache match (3), queue length (2) and KV-cache utilisation (2); highest wins",
            "llm-d inference scheduler / Gateway API Inference Extension endpoint picker default profile",
            scorers=(_s("prefix-cache", 3.0), _s("queue", 2.0), _s("kv-usage", 2.0)),
        ),
        Preset(
            "dynamo-cost",
            "cost = uncached prompt blocks (prefill) + active KV blocks incl. this call (decode); lowest wins",
            "NVIDIA Dynamo KV router (overlap_score_weight=1, temperature 0)",
            scorers=(_s("dynamo-cost"),),
        ),
        Preset(
            "llm-d-tiered",
            "llm-d-scorers with the prefix scorer crediting host-tier (CPU) blocks past the GPU prefix 0.8 of a GPU block",
            "llm-d inference scheduler, tiered prefix-cache scoring (GPU 1.0, CPU 0.8) with vLLM CPU offloading",
            scorers=(_s("tiered-prefix", 3.0, host_weight=0.8), _s("queue", 2.0), _s("kv-usage", 2.0)),
        ),
        Preset(
            "dynamo-kvbm",
            "dynamo-cost with the overlap counting host-tier blocks 0.75 (disk 0.25) of a GPU block",
            "NVIDIA Dynamo KV router with the KV block manager (G2 host 0.75, G3 disk 0.25)",
            scorers=(_s("dynamo-kvbm-cost"),),
        ),
        Preset(
            "llm-d-lora",
            "llm-d-scorers plus LoRA affinity (2): 1 where the call's adapter runs or waits, 0.8 where a batch "
            "slot is free (running + waiting adapters below max_lora), else 0",
            "llm-d inference scheduler / Gateway API Inference Extension lora-affinity-scorer, from "
            "vllm:lora_requests_info",
            scorers=(_s("prefix-cache", 3.0), _s("queue", 2.0), _s("kv-usage", 2.0),
                     _s("adapter-affinity", 2.0, waiting_score=1.0, free_slot_score=0.8, unknown_score=0.0)),
        ),
        Preset(
            "aibrix-lora",
            "each adapter bound, at first sight, to the pod with the fewest bound adapters and loaded there; "
            "its calls go only to that pod (least-request among its pods when bound to several)",
            "AIBrix ModelAdapter controller (least-adapters scheduler, spec.replicas 1) and its gateway's "
            "per-adapter Service endpoints with the least-request strategy "
            "(aibrix docs/source/features/lora-dynamic-loading.rst)",
            scorers=(_s("adapter-binding", 10.0, replicas=1, preload=True), _s("least-loaded", 1.0)),
        ),
        Preset(
            "continuum-ttl",
            "a session stays pinned to its replica for a TTL drawn from its agent's tool-gap distribution "
            "(mean + k std), then tier-aware prefix (saved prefill time) and load",
            "Continuum (TTL across tool calls); the pin is a routing pin: the simulated engine keeps no "
            "KV pinned on GPU",
            scorers=(_s("tiered-prefix", 3.0), _s("session-affinity", 3.0), _s("queue", 1.0), _s("kv-usage", 1.0)),
            sticky=True,
        ),
        _TASKPLANE,
        # the same policy under the name the disaggregation benches and ``dev up --pd`` use
        replace(_TASKPLANE, name="taskplane-pd", summary=(
            "taskplane, disaggregating from the agent's context: a long new prompt, a tight budget or a "
            "decode-heavy replica send the prefill to a prefill replica where the prefix already is "
            "(prefix 3, predicted latency 2, memory 1); a warm session whose KV sits on its decode "
            "replica stays there")),
        Preset(
            "llm-d-pd",
            "llm-d-scorers over decode (and both) replicas; then, when the prompt's suffix not cached on "
            "the chosen decode replica reaches threshold (0: always), the prefill profile (prefix-cache 3, "
            "queue 2, kv-usage 2) picks a prefill replica",
            "llm-d inference scheduler pd-profile-handler with prefill-header-handler (x-prefiller-host-port)",
            scorers=(_s("prefix-cache", 3.0), _s("queue", 2.0), _s("kv-usage", 2.0)),
            disaggregation={
                "decider": {"type": "llm-d-pd", "params": {"threshold": 0}},
                "scorers": (_s("prefix-cache", 3.0), _s("queue", 2.0), _s("kv-usage", 2.0)),
            },
        ),
        Preset(
            "dynamo-disagg",
            "dynamo-cost picks the decode worker; the prefill goes remote when its length minus the decode "
            "worker's prefix hit exceeds 1000 tokens and fewer than 2 requests wait on the prefill workers, "
            "to the least-loaded prefill worker",
            "NVIDIA Dynamo disaggregated router (max_local_prefill_length=1000, max_prefill_queue_size=2)",
            scorers=(_s("dynamo-cost"),),
            disaggregation={
                "decider": {"type": "dynamo-disagg"},
                "scorers": (_s("least-loaded"),),
            },
        ),
    )
}


def policy_names() -> list[str]:
    return list(PRESETS)
