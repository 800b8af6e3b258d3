"""Named placement policies: each a configuration of the same framework.

``build_policy(name_or_config, seed=...)`` is the one entry point the gateway and the
cluster simulator share. The baselines reproduce the published rule of each system as
closely as plain replica state allows; docs/scheduler.md gives each rule and its source.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from taskplane.errors import ConfigError
from taskplane.scheduler import filters as _filters  # noqa: F401  (registers the plugins)
from taskplane.scheduler import pickers as _pickers  # noqa: F401
from taskplane.scheduler import scorers as _scorers  # noqa: F401
from taskplane.scheduler.admission import AdmissionSettings
from taskplane.scheduler.core import Scheduler
from taskplane.scheduler.framework import REGISTRY, Filter, Kind, Picker, Scorer


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
    extra: dict[str, Any] = field(default_factory=dict)


def _s(type_name: str, weight: float = 1.0, **params: Any) -> dict[str, Any]:
    return {"type": type_name, "weight": weight, "params": params}


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
            "taskplane",
            "all seven axes: filters (health, tenant GPUs, memory headroom, latency budget), scorers "
            "(prefix 3, session pin 2, predicted latency 2, memory 1, warmth 1, price 1, workflow 1), "
            "admission control with priority bands, fair share, EDF and shedding",
            "this project",
            filters=("healthy", "tenant-gpu", "memory-headroom", "latency-budget"),
            scorers=(
                _s("prefix-cache", 3.0),
                _s("session-affinity", 2.0),
                _s("latency", 2.0),
                _s("memory-headroom", 1.0),
                _s("weight-warmth", 1.0),
                _s("gpu-price", 1.0),
                _s("workflow-context", 1.0),
            ),
            admission=True,
            sticky=True,
        ),
    )
}


def policy_names() -> list[str]:
    return list(PRESETS)


def _build_list(kind: Kind, specs: Iterable[Any], policy: str) -> list[Any]:
    return [REGISTRY.build(kind, spec, policy=policy) for spec in specs]


def build_scheduler(
    *,
    policy: str = "taskplane",
    filters: Iterable[Any] | None = None,
    scorers: Iterable[Any] | None = None,
    picker: Any | None = None,
    seed: int = 0,
    admission: bool | AdmissionSettings | None = None,
    response_cache_entries: int = 0,
    tenants: Iterable[Any] | None = None,
    pools: Iterable[Any] | None = None,
    name: str | None = None,
    metrics: bool = True,
) -> Scheduler:
    """Build a Scheduler from a preset, with optional plugin overrides."""
    preset = PRESETS.get(policy)
    if preset is None:
        raise ConfigError(
            f"scheduler policy {policy!r}: no such preset; choose one of {', '.join(PRESETS)}"
        )
    label = name or policy
    built_filters: list[Filter] = _build_list(Kind.FILTER, preset.filters if filters is None else filters, label)
    built_scorers: list[Scorer] = _build_list(Kind.SCORER, preset.scorers if scorers is None else scorers, label)
    built_picker: Picker = REGISTRY.build(Kind.PICKER, preset.picker if picker is None else picker, policy=label)  # type: ignore[assignment]
    if isinstance(admission, AdmissionSettings):
        settings: AdmissionSettings | None = admission
    elif admission is None:
        settings = AdmissionSettings() if preset.admission else None
    else:
        settings = AdmissionSettings() if (admission and preset.admission) else None
    fallbacks = {p.model: p.fallback for p in (pools or ()) if getattr(p, "fallback", None)}
    return Scheduler(
        name=label,
        filters=built_filters,
        scorers=built_scorers,
        picker=built_picker,
        seed=seed,
        admission=settings,
        sticky=preset.sticky,
        response_cache_entries=response_cache_entries,
        tenants=tenants,
        fallbacks=fallbacks,
        metrics=metrics,
    )


def scheduler_from_config(
    config: Any,
    *,
    tenants: Iterable[Any] | None = None,
    pools: Iterable[Any] | None = None,
    name: str | None = None,
    metrics: bool = True,
    seed: int | None = None,
) -> Scheduler:
    """``taskplane.config.SchedulerConfig`` (or a mapping of its fields) -> Scheduler.

    ``admission: true`` keeps a preset's admission control (only "taskplane" has it);
    ``false`` turns it off. Baseline presets never gain admission control, so they stay
    faithful to the systems they reproduce.
    """
    if isinstance(config, Mapping):
        from taskplane.config import SchedulerConfig

        try:
            config = SchedulerConfig.model_validate(dict(config))
        except Exception as exc:  # pydantic ValidationError
            raise ConfigError(f"scheduler config: {exc}") from None
    return build_scheduler(
        policy=config.policy,
        filters=config.filters,
        scorers=config.scorers,
        picker=getattr(config, "picker", None),
        seed=config.seed if seed is None else seed,
        admission=bool(config.admission),
        response_cache_entries=config.response_cache_entries,
        tenants=tenants,
        pools=pools,
        name=name,
        metrics=metrics,
    )


def build_policy(
    name_or_config: Any,
    *,
    seed: int | None = None,
    tenants: Iterable[Any] | None = None,
    pools: Iterable[Any] | None = None,
    metrics: bool = True,
    admission: bool | AdmissionSettings | None = None,
) -> Scheduler:
    """The entry point shared by the gateway and the simulator.

    ``name_or_config``: a preset name ("taskplane", "round-robin", ...), a
    ``SchedulerConfig`` or a mapping of its fields. ``seed`` overrides the config's seed.
    """
    if isinstance(name_or_config, str):
        return build_scheduler(
            policy=name_or_config,
            seed=seed or 0,
            tenants=tenants,
            pools=pools,
            metrics=metrics,
            admission=admission,
        )
    return scheduler_from_config(name_or_config, tenants=tenants, pools=pools, metrics=metrics, seed=seed)
