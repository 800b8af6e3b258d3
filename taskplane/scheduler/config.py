"""The scheduler's section of the gateway's config file (``scheduler:``): a policy preset and
the plugins that override it. ``taskplane.config.GatewayConfig`` holds one; the assembly
(``taskplane.scheduler.flowcontrol.assembly``) builds a pipeline from one, or from a mapping
of its fields."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class PluginConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = Field(description="registered plugin type name")
    weight: float = Field(default=1.0, ge=0, description="scorer weight; ignored for filters")
    params: dict[str, Any] = Field(default_factory=dict, description="plugin-specific settings")


class DisaggregationConfig(BaseModel):
    """Prefill/decode disaggregation (docs/scheduler.md): each key set replaces the preset's."""

    model_config = ConfigDict(extra="forbid")

    decider: PluginConfig | None = Field(
        default=None, description="the disaggregation decider (llm-d-pd, dynamo-disagg, agent-pd); null: never"
    )
    filters: list[PluginConfig] | None = Field(default=None, description="the prefill profile's filters")
    scorers: list[PluginConfig] | None = Field(default=None, description="the prefill profile's scorers")
    picker: PluginConfig | None = Field(default=None, description="the prefill profile's picker")


class AdapterCostsConfig(BaseModel):
    """LoRA adapter load times in the latency model's TTFT (``scheduler.adapter_costs``); the
    defaults are the simulator's (docs/scheduler.md, "Latency model")."""

    model_config = ConfigDict(extra="forbid")

    disk_load_s: float = Field(default=0.25, ge=0, description="reading an adapter from disk into host memory")
    gpu_load_s: float = Field(default=0.005, ge=0, description="copying an adapter from host memory into a GPU slot")
    step_overhead: float = Field(default=0.05, ge=0, description="slowdown of a step with any LoRA request")
    per_adapter_overhead: float = Field(default=0.02, ge=0, description="extra slowdown per distinct adapter in a step")


class SchedulerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: str = Field(default="taskplane", description="a named policy preset (see taskplane.scheduler.policies)")
    filters: list[PluginConfig] | None = Field(default=None, description="override the preset's filters")
    scorers: list[PluginConfig] | None = Field(default=None, description="override the preset's scorers")
    seed: int = Field(default=0, description="tie-break seed of the picker")
    admission: bool = Field(default=True, description="priority admission queue and shedding")
    flow_control: list[PluginConfig] | None = Field(
        default=None,
        description="replace the preset's flow-control plugins role by role (ordering, fairness, shedding, "
        "working-set room, late binding, prefill gate); see docs/scheduler.md",
    )
    disaggregation: DisaggregationConfig | None = Field(
        default=None,
        description="prefill/decode disaggregation over prefill-role replicas (overrides the preset's)",
    )
    response_cache_entries: int = Field(default=1024, ge=0, description="exact cache for temperature-0 calls; 0 = off")
    adapter_costs: AdapterCostsConfig = Field(
        default_factory=AdapterCostsConfig,
        description="LoRA adapter load times and batch slowdown the latency model adds to a call's predicted TTFT",
    )
