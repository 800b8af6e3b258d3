"""Configuration: the gateway's YAML file (pools, replicas, tenants, scheduler) and the
``TASKPLANE_*`` settings.

Precedence is flags, then environment variables, then the file. Every loader error is a
``ConfigError`` whose message names the file, the field and what to do about it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from taskplane.errors import ConfigError, describe_validation
from taskplane.scheduler.config import SchedulerConfig
from taskplane.scheduler.types import Priority

GpuName = Literal["h100", "h200", "b200", "l40s", "a100", "cpu"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplicaConfig(_Strict):
    url: str = Field(description="Base URL of an OpenAI-compatible vLLM server, e.g. http://10.0.0.5:8000")
    gpu: GpuName = Field(default="h100", description="GPU generation; sets the timing model and default price")
    kv_events: str | None = Field(default=None, description="ZMQ endpoint of vLLM's KV-event publisher")
    kv_replay: str | None = Field(default=None, description="ZMQ endpoint of the publisher's replay socket (gap recovery)")
    cost_per_hour_usd: float | None = Field(default=None, ge=0, description="price; default from the price book")
    name: str | None = Field(default=None, description="stable replica name; default derived from the URL")
    metrics_url: str | None = Field(default=None, description="Prometheus endpoint; default URL + /metrics")
    kv_blocks: int | None = Field(default=None, ge=1, description="KV blocks; default read from /metrics")
    max_num_seqs: int = Field(default=256, ge=1, description="the engine's batch limit (vLLM --max-num-seqs)")
    block_size: int | None = Field(default=None, ge=1, description="tokens per KV block; default from /metrics")
    draining: bool = Field(default=False, description="no new placements; calls in flight finish (autoscaler scale-in)")
    cordoned: bool = Field(default=False, description="no new sessions; sessions last placed here keep coming "
                           "(autoscaler scale-in and pre-drain: the replica empties without re-prefilling anyone)")
    role: Literal["prefill", "decode", "both"] = Field(
        default="both", description="prefill/decode disaggregation: prefill (computes prompts whose KV a decode "
        "replica pulls; vLLM kv_producer), decode (generates; usually a pd-sidecar in front of a kv_consumer) "
        "or both (whole calls: the aggregated fleet)")

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")

    @property
    def replica_name(self) -> str:
        return self.name or self.url.split("://", 1)[1]


class DiscoveryConfig(_Strict):
    """Where a pool's replicas come from in Kubernetes (see taskplane.engines.discovery).

    ``source: endpointslices`` (default) follows the EndpointSlices of ``service`` (a
    headless Service over the vLLM pods); ``source: pods`` follows the pods matching
    ``label_selector``. Only ready endpoints become replicas; scale-ups and scale-downs
    reach the gateway without a restart.
    """

    source: Literal["endpointslices", "pods", "file"] = Field(
        default="endpointslices", description="follow a Service's EndpointSlices, labelled pods, or a replicas file"
    )
    path: str | None = Field(
        default=None, description="source file: a JSON file {\"replicas\": [replica, ...]} re-read when it changes"
        " (the dev stack's autoscaler writes it)"
    )
    namespace: str | None = Field(
        default=None, description="namespace to watch; default: the gateway pod's own namespace"
    )
    service: str | None = Field(
        default=None, description="Service whose EndpointSlices list the replicas (source endpointslices)"
    )
    label_selector: str | None = Field(
        default=None,
        description="Kubernetes label selector, e.g. 'taskplane.io/pool=llama-3-1-8b'; required for "
        "source pods, an extra filter on the EndpointSlices otherwise",
    )
    port: int | str = Field(
        default="http", description="port name (or number) of the OpenAI-compatible server"
    )
    kv_events_port: int | str | None = Field(
        default="kv-events", description="port name (or number) of vLLM's ZMQ KV-event publisher; null: none"
    )
    scheme: Literal["http", "https"] = Field(default="http", description="scheme of the replica URLs")
    gpu: GpuName = Field(default="h100", description="GPU generation of the discovered replicas")
    gpu_label: str = Field(
        default="taskplane.io/gpu", description="pod label that overrides gpu per pod (source pods)"
    )
    cost_per_hour_usd: float | None = Field(
        default=None, ge=0, description="price per replica-hour; default from the price book"
    )
    api_url: str | None = Field(
        default=None,
        description="Kubernetes API base URL; default: in-cluster (KUBERNETES_SERVICE_HOST/PORT)",
    )
    token_file: str | None = Field(
        default=None, description="bearer token file; default: the pod's service account token"
    )
    ca_file: str | None = Field(
        default=None, description="CA bundle for the API server; default: the service account's ca.crt"
    )
    watch: bool = Field(default=True, description="stream changes with watch=1; false: list every poll_interval_s")
    poll_interval_s: float = Field(
        default=5.0, gt=0, description="list period without watch; retry delay after an error"
    )
    watch_timeout_s: int = Field(
        default=300, ge=1, description="timeoutSeconds of one watch request before it is renewed"
    )

    @model_validator(mode="after")
    def _target(self) -> DiscoveryConfig:
        if self.source == "endpointslices" and not (self.service or self.label_selector):
            raise ValueError("discovery needs 'service' (or 'label_selector') for source endpointslices")
        if self.source == "file":
            if not self.path:
                raise ValueError("discovery with source file needs 'path'")
            return self
        if self.source == "pods" and not self.label_selector:
            raise ValueError("discovery with source pods needs 'label_selector'")
        return self


class PoolConfig(_Strict):
    model: str = Field(description="model name clients ask for")
    fallback: str | None = Field(default=None, description="a cheaper model calls may be moved to")
    max_context_tokens: int = Field(default=8192, ge=1, description="prompt + completion limit")
    replicas: list[ReplicaConfig] = Field(default_factory=list)
    discovery: DiscoveryConfig | None = Field(
        default=None, description="Kubernetes endpoint discovery instead of a static replica list"
    )
    hold_when_empty_s: float = Field(
        default=0.0, ge=0, le=3600,
        description="scale to zero: a call while no replica of this pool is up waits this long for one "
                    "(an autoscaler sees it in taskplane_gateway_queued_calls) instead of a 503; 0: off",
    )
    sleep_level: int = Field(
        default=0, ge=0, le=2,
        description="autoscaler scale-in: put the drained replica to sleep (vLLM sleep mode; 1: weights offloaded "
                    "to host memory, 2: discarded) instead of removing it, and wake it first on a scale-out (a hot "
                    "start in seconds); the engine needs --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1; 0: remove it",
    )
    sleep_max_s: float = Field(
        default=600.0, ge=0,
        description="a replica asleep this long is removed: asleep it still holds its GPU, paid for like a serving one",
    )


class TenantConfig(_Strict):
    id: str
    api_key_sha256: str | None = Field(default=None, description="hex sha256 of the tenant's API key")
    max_priority: Priority = Field(default=Priority.STANDARD, description="highest priority the tenant may ask for")
    weight: float = Field(default=1.0, gt=0, description="fair-share weight inside a priority band")
    excluded_gpus: list[GpuName] = Field(default_factory=list, description="GPU generations never used")
    max_concurrent: int = Field(default=256, ge=1, description="concurrent requests in flight")


class LimitsConfig(_Strict):
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_tokens: int = Field(default=8192, ge=1)
    request_timeout_s: float = Field(default=120.0, gt=0)
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="a request body not fully received by then is refused with 408 (slow uploads)"
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0, description="a connection that has not sent its request headers by then is closed"
    )


class GatewayConfig(_Strict):
    pools: list[PoolConfig] = Field(min_length=1)
    tenants: list[TenantConfig] = Field(default_factory=list)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    auth: bool = Field(default=True, description="require tenant API keys (off under `taskplane dev`)")
    admin_token_sha256: str | None = Field(default=None, description="sha256 of the admin token for /admin and /reports")
    database_url: str | None = Field(default=None, description="postgresql+asyncpg:// URL for cost rows")
    outbox_dir: str | None = Field(default=None, description="durable outbox for cost rows while Postgres is down")

    def pool_for(self, model: str) -> PoolConfig | None:
        for pool in self.pools:
            if pool.model == model:
                return pool
        return None

    def tenant(self, tenant_id: str) -> TenantConfig | None:
        for t in self.tenants:
            if t.id == tenant_id:
                return t
        return None


def _describe(err: ValidationError) -> str:
    return describe_validation(err)


def load_gateway_config(path: str | Path) -> GatewayConfig:
    """Load and validate the gateway YAML; raise ``ConfigError`` with one clear line on failure."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"gateway config {p}: no such file; pass --config with a YAML file (see README)")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"gateway config {p}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return parse_gateway_config(data, source=str(p))


def parse_gateway_config(data: Any, *, source: str = "config") -> GatewayConfig:
    """Validate already-parsed YAML data."""
    if not isinstance(data, dict):
        raise ConfigError(f"gateway config {source}: expected a mapping with 'pools:' at the top")
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"gateway config {source}: {_describe(exc)}") from None


class Settings(BaseSettings):
    """Process-wide settings from ``TASKPLANE_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="TASKPLANE_", extra="ignore")

    database_url: str | None = None
    temporal_address: str | None = None
    temporal_namespace: str = "default"
    gateway_url: str | None = None
    state_dir: str = ".taskplane"
    log_level: str = "info"


def settings() -> Settings:
    return Settings()


def state_dir() -> Path:
    return Path(os.environ.get("TASKPLANE_STATE_DIR", ".taskplane")).resolve()
