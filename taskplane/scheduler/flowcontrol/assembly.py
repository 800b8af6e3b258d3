"""Assembling a placement pipeline and the flow control around it, from a preset (with
optional plugin overrides) or a ``taskplane.scheduler.config.SchedulerConfig``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from taskplane.errors import ConfigError
from taskplane.scheduler import disagg as _disagg  # noqa: F401  (registers the deciders)
from taskplane.scheduler import filters as _filters  # noqa: F401  (registers the plugins)
from taskplane.scheduler import pickers as _pickers  # noqa: F401
from taskplane.scheduler import scorers as _scorers  # noqa: F401
from taskplane.scheduler.adapter_cost import AdapterCosts
from taskplane.scheduler.config import SchedulerConfig
from taskplane.scheduler.core import Scheduler
from taskplane.scheduler.disagg.step import DisaggStep
from taskplane.scheduler.flowcontrol.flowset import flow_from_settings
from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.scheduler.framework.plugin import Filter, Kind, Picker, Scorer
from taskplane.scheduler.framework.registry import REGISTRY
from taskplane.scheduler.kv.lifetimes import LifetimePlanner
from taskplane.scheduler.latency import LatencyModel
from taskplane.scheduler.presets import PRESETS


def _build_list(kind: Kind, specs: Iterable[Any], policy: str) -> list[Any]:
    return [REGISTRY.build(kind, spec, policy=policy) for spec in specs]


@dataclass(frozen=True, kw_only=True)
class PipelineOptions:
    """What a flow control is made of: a preset, the plugins overriding its own (None keeps
    the preset's), its admission control, and the flow-control plugins replacing the
    preset's role by role."""

    policy: str = "taskplane"
    filters: Iterable[Any] | None = None
    scorers: Iterable[Any] | None = None
    picker: Any | None = None
    seed: int = 0
    admission: bool | AdmissionSettings | None = None
    response_cache_entries: int = 0
    flow_control: Iterable[Any] | None = None
    # replaces the preset's disaggregation (decider, prefill filters, scorers, picker) key by key;
    # {"decider": None}: none
    disaggregation: Mapping[str, Any] | None = None
    # LoRA adapter load times and batch slowdown in the latency model (None: the defaults)
    adapter_costs: AdapterCosts | None = None


def _spec(value: Any) -> Any:
    """A pydantic plugin config as the registry's mapping (mappings and names as they are)."""
    dump = getattr(value, "model_dump", None)
    return dump() if dump is not None else value


def build_disagg(preset: Mapping[str, Any] | None, override: Mapping[str, Any] | None, label: str) -> DisaggStep | None:
    """The disaggregation step of a preset's spec with a config's overrides (None: no step)."""
    spec = dict(preset or {})
    for key, value in (override or {}).items():
        if value is not None or key == "decider":
            spec[key] = value
    decider = spec.get("decider")
    if decider is None:
        return None
    return DisaggStep(
        REGISTRY.build(Kind.DECIDER, _spec(decider), policy=label),  # type: ignore[arg-type]
        [REGISTRY.build(Kind.FILTER, _spec(f), policy=label) for f in spec.get("filters") or ("healthy",)],  # type: ignore[misc]
        [REGISTRY.build(Kind.SCORER, _spec(f), policy=label) for f in spec.get("scorers") or ()],  # type: ignore[misc]
        REGISTRY.build(Kind.PICKER, _spec(spec.get("picker") or "max-score"), policy=label),  # type: ignore[arg-type]
    )


def assemble(
    options: PipelineOptions,
    *,
    tenants: Iterable[Any] | None = None,
    pools: Iterable[Any] | None = None,
    name: str | None = None,
    metrics: bool = True,
) -> dict[str, Any]:
    """The pipeline and flow control of ``options`` for the gateway's tenants and pools, as
    the keyword arguments of ``FlowControl``."""
    o = options
    policy, filters, scorers, picker, admission = o.policy, o.filters, o.scorers, o.picker, o.admission
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
    flow = flow_from_settings(settings, o.flow_control, policy=label)
    pipeline = Scheduler(
        name=label,
        filters=built_filters,
        scorers=built_scorers,
        picker=built_picker,
        seed=o.seed,
        tenants=tenants,
        load=flow.load() if flow is not None else None,
        latency=LatencyModel(adapter_costs=o.adapter_costs),
        sticky=preset.sticky,
        metrics=metrics,
        lifetimes=LifetimePlanner() if preset.kv_lifetimes else None,
        disagg=build_disagg(preset.disaggregation, o.disaggregation, label),
    )
    fallbacks = {p.model: p.fallback for p in (pools or ()) if getattr(p, "fallback", None)}
    return {
        "pipeline": pipeline,
        "flow": flow,
        "fallbacks": fallbacks,
        "response_cache_entries": o.response_cache_entries,
    }


def assemble_from_config(
    config: Any,
    *,
    tenants: Iterable[Any] | None = None,
    pools: Iterable[Any] | None = None,
    name: str | None = None,
    metrics: bool = True,
    seed: int | None = None,
) -> dict[str, Any]:
    """``assemble`` for a ``taskplane.scheduler.config.SchedulerConfig`` (or a mapping of its fields).

    ``admission: true`` keeps a preset's admission control (only "taskplane" has it);
    ``false`` turns it off. Baseline presets never gain admission control, so they stay
    faithful to the systems they reproduce. ``flow_control`` replaces the preset's
    flow-control plugins role by role (ignored without admission control).
    """
    if isinstance(config, Mapping):
        try:
            config = SchedulerConfig.model_validate(dict(config))
        except ValidationError as exc:
            raise ConfigError(f"scheduler config: {exc}") from None
    options = PipelineOptions(
        policy=config.policy,
        filters=config.filters,
        scorers=config.scorers,
        picker=getattr(config, "picker", None),
        seed=config.seed if seed is None else seed,
        admission=bool(config.admission),
        response_cache_entries=config.response_cache_entries,
        flow_control=getattr(config, "flow_control", None),
        disaggregation=_disagg_override(getattr(config, "disaggregation", None)),
        adapter_costs=_adapter_costs(getattr(config, "adapter_costs", None)),
    )
    return assemble(options, tenants=tenants, pools=pools, name=name, metrics=metrics)


def _disagg_override(value: Any) -> Mapping[str, Any] | None:
    """A config's ``disaggregation`` section as the keys it sets (unset keys keep the preset's)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return value
    return value.model_dump(exclude_unset=True)


def _adapter_costs(value: Any) -> AdapterCosts | None:
    """A config's ``adapter_costs`` section as the latency model's settings (None: defaults)."""
    if value is None:
        return None
    return AdapterCosts(**(value if isinstance(value, Mapping) else value.model_dump()))
