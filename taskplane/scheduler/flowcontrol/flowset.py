"""The flow-control plugins of one policy, by role, built from registry specs: a preset's
(its ``AdmissionSettings``) with a config's ``flow_control`` list replacing plugins of the
same role."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from taskplane.errors import ConfigError
from taskplane.scheduler.flowcontrol.backlog import PrefillBacklog
from taskplane.scheduler.flowcontrol.base import FlowPlugin
from taskplane.scheduler.flowcontrol.gate import PrefillGatePlugin
from taskplane.scheduler.flowcontrol.ordering import PriorityEdf, WeightedFairShare
from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.scheduler.flowcontrol.shedding import Shedding
from taskplane.scheduler.flowcontrol.workingset import WorkingSetRoom
from taskplane.scheduler.framework.handle import Load
from taskplane.scheduler.framework.plugin import Kind
from taskplane.scheduler.framework.registry import REGISTRY


@dataclass(slots=True)
class FlowSet:
    """One plugin per role (None: the role is off)."""

    ordering: PriorityEdf | None = None
    fairness: WeightedFairShare | None = None
    shedding: Shedding | None = None
    room: WorkingSetRoom | None = None
    backlog: PrefillBacklog | None = None
    gate: PrefillGatePlugin | None = None

    @property
    def plugins(self) -> list[FlowPlugin]:
        return [p for p in (self.ordering, self.fairness, self.shedding, self.room, self.backlog, self.gate) if p]

    def load(self) -> Load:
        """The saturation rule the pipeline's per-decision state applies under this flow control."""
        shed = self.shedding
        room = self.room if self.room is not None and self.room.on else None
        return Load(
            max_waiting=shed.params.max_waiting_per_replica if shed is not None else 2,
            holds_calls=True,
            room_limit=room.limit if room is not None else None,
            room_host_share=max(room.params.host_share, 0.0) if room is not None else 0.0,
        )

    def settings(self) -> AdmissionSettings:
        """The flat record of these plugins' settings."""
        return AdmissionSettings.from_plugins(self.plugins)


_ATTR = {"ordering": "ordering", "fairness": "fairness", "shedding": "shedding", "room": "room",
         "backlog": "backlog", "gate": "gate"}


def build_flow(specs: Iterable[Any], overrides: Iterable[Any] | None = None, *, policy: str = "custom") -> FlowSet:
    """Plugins from ``specs``; each of ``overrides`` replaces the plugin of its role."""
    out = FlowSet()
    for group in (specs, overrides or ()):
        seen: set[str] = set()
        for spec in group:
            plugin = REGISTRY.build(Kind.FLOW, spec, policy=policy)
            assert isinstance(plugin, FlowPlugin)
            if plugin.role in seen:
                raise ConfigError(f"scheduler flow_control: two plugins for role {plugin.role!r}")
            seen.add(plugin.role)
            setattr(out, _ATTR[plugin.role], plugin)
    return out


def flow_from_settings(settings: AdmissionSettings | None, overrides: Iterable[Any] | None = None,
                       *, policy: str = "custom") -> FlowSet | None:
    """The plugins of ``settings`` (None: no flow control), with ``overrides``."""
    if settings is None:
        return None
    return build_flow(settings.plugin_specs(), overrides, policy=policy)
