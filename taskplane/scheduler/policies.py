"""The entry points the gateway and the cluster simulator share: a preset or a config in,
flow control composing its placement pipeline out (the presets: :mod:`taskplane.scheduler.presets`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from taskplane.scheduler.flowcontrol.assembly import PipelineOptions, assemble, assemble_from_config
from taskplane.scheduler.flowcontrol.controller import FlowControl
from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.scheduler.presets import PRESETS, Preset, policy_names

__all__ = ["PRESETS", "Preset", "build_policy", "build_scheduler", "policy_names", "scheduler_from_config"]


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
) -> FlowControl:
    """Build from a preset, with optional plugin overrides."""
    options = PipelineOptions(policy=policy, filters=filters, scorers=scorers, picker=picker, seed=seed,
                              admission=admission, response_cache_entries=response_cache_entries)
    return FlowControl(**assemble(options, tenants=tenants, pools=pools, name=name, metrics=metrics))


def scheduler_from_config(
    config: Any,
    *,
    tenants: Iterable[Any] | None = None,
    pools: Iterable[Any] | None = None,
    name: str | None = None,
    metrics: bool = True,
    seed: int | None = None,
) -> FlowControl:
    """``taskplane.scheduler.config.SchedulerConfig`` (or a mapping of its fields) -> FlowControl."""
    return FlowControl(**assemble_from_config(config, tenants=tenants, pools=pools, name=name, metrics=metrics, seed=seed))


def build_policy(
    name_or_config: Any,
    *,
    seed: int | None = None,
    tenants: Iterable[Any] | None = None,
    pools: Iterable[Any] | None = None,
    metrics: bool = True,
    admission: bool | AdmissionSettings | None = None,
) -> FlowControl:
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
