"""What a cluster simulation returns: one record per attempt, per task and per replica.

Times are virtual seconds from the start of the run; :meth:`ClusterResult.attempt_records`
and :meth:`ClusterResult.task_records` turn them into the rows the gateway writes.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from taskplane.store.records import AttemptRecord, Outcome, TaskRecord, TaskStatus

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


@dataclass(slots=True)
class CallRecord:
    """One attempt of one call, in virtual seconds (converted to AttemptRecord on demand)."""

    attempt_key: str
    task_id: str
    step: int
    attempt: int
    session_id: str
    tenant: str
    agent: str
    priority: str
    model_requested: str
    model_served: str | None
    replica: str | None
    gpu: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    offered_s: float  # first offered to the policy (this attempt)
    dispatched_s: float | None  # sent to a replica
    admitted_s: float | None  # the engine scheduled it
    first_token_s: float | None
    finished_s: float
    gpu_seconds: float
    cost_usd: float
    outcome: Outcome
    error_type: str | None = None
    tier_load_s: float = 0.0  # host / remote -> GPU KV transfer its admission paid (simulated tiers)
    prefill_replica: str | None = None  # disaggregated: where its prompt was computed (None: on ``replica``)
    transfer_ms: float = 0.0  # disaggregated: the KV pull from the prefill replica
    transferred_tokens: int = 0  # disaggregated: prompt tokens whose KV moved over the link

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.offered_s

    @property
    def itl_s(self) -> float | None:
        """Mean inter-token latency of its decode (None with fewer than two tokens)."""
        if self.first_token_s is None or self.completion_tokens < 2:
            return None
        return (self.finished_s - self.first_token_s) / (self.completion_tokens - 1)

    @property
    def queue_s(self) -> float:
        return (self.admitted_s if self.admitted_s is not None else self.finished_s) - self.offered_s

    @property
    def total_s(self) -> float:
        return self.finished_s - self.offered_s


@dataclass(slots=True)
class TaskResult:
    task_id: str
    agent: str
    tenant: str
    priority: str
    status: TaskStatus
    arrival_s: float
    finished_s: float | None
    deadline_s: float | None  # absolute
    deadline_met: bool | None
    cost_usd: float
    attempts: int
    retries: int
    calls_done: int
    calls_total: int
    error: str | None = None


@dataclass(slots=True)
class ReplicaResult:
    name: str
    gpu: str
    cost_per_hour_usd: float
    busy_s: float
    steps: int
    prefix_queries: int
    prefix_hits: int
    finished: int
    # KV tiers below the GPU (zero without them): tokens served from and moved between tiers
    host_hit_tokens: int = 0
    remote_hit_tokens: int = 0
    loaded_tokens: int = 0
    offloaded_tokens: int = 0
    prefetched_tokens: int = 0
    # LoRA (zero without it): adapter weights read from disk, and copied into a GPU slot
    lora_disk_loads: int = 0
    lora_gpu_loads: int = 0
    lora_preloads: int = 0  # host copies read ahead of demand by a policy's pre-load plan
    lora_unloads: int = 0  # adapters a policy's plan unregistered (/v1/unload_lora_adapter)
    # several base models (taskplane.sim.swap_cluster): swaps done, and the seconds they took
    model_swaps: int = 0
    swap_s: float = 0.0


@dataclass
class ClusterResult:
    calls: list[CallRecord]
    tasks: list[TaskResult]
    replicas: list[ReplicaResult]
    end_s: float  # virtual time of the last event
    decision_ns: array  # wall time of each policy call (not deterministic; not in records)
    policy_calls: int = 0
    kv_lifetimes: dict[str, int] = field(default_factory=dict)  # lifetime plans carried out (with tiers)
    role_moves: list[tuple[float, str, str]] = field(default_factory=list)  # (t, replica, new role): role planning
    mean_prefill_replicas: float | None = None  # time-weighted prefill-role replicas (role planning only)

    @property
    def fleet_gpu_seconds(self) -> float:
        return self.end_s * len(self.replicas)

    @property
    def fleet_cost_usd(self) -> float:
        """Every replica paid for the whole run (idle included): the fully loaded spend."""
        return sum(r.cost_per_hour_usd for r in self.replicas) * self.end_s / 3600.0

    def attempt_records(self, epoch: datetime = EPOCH) -> list[AttemptRecord]:
        """The calls as the rows the gateway writes to Postgres."""
        out = []
        for c in self.calls:
            out.append(AttemptRecord.model_construct(
                attempt_key=c.attempt_key, task_id=c.task_id, step=c.step, attempt=c.attempt,
                session_id=c.session_id, tenant=c.tenant, agent=c.agent, model_requested=c.model_requested,
                model_served=c.model_served, replica=c.replica, gpu=c.gpu, prompt_tokens=c.prompt_tokens,
                cached_tokens=c.cached_tokens, completion_tokens=c.completion_tokens,
                queue_ms=c.queue_s * 1000.0, ttft_ms=None if c.ttft_s is None else c.ttft_s * 1000.0,
                total_ms=c.total_s * 1000.0, gpu_seconds=c.gpu_seconds, price_version=None,
                cost_usd=c.cost_usd, outcome=c.outcome, error_type=c.error_type,
                started_at=epoch + timedelta(seconds=c.offered_s),
            ))
        return out

    def task_records(self, epoch: datetime = EPOCH) -> list[TaskRecord]:
        out = []
        for t in self.tasks:
            out.append(TaskRecord.model_construct(
                task_id=t.task_id, agent=t.agent, tenant=t.tenant, priority=t.priority, status=t.status,
                deadline=None if t.deadline_s is None else epoch + timedelta(seconds=t.deadline_s),
                deadline_met=t.deadline_met, started_at=epoch + timedelta(seconds=t.arrival_s),
                finished_at=None if t.finished_s is None else epoch + timedelta(seconds=t.finished_s),
                cost_usd=t.cost_usd, attempts=t.attempts, retries=t.retries, error=t.error,
            ))
        return out

    def summary(self) -> dict[str, Any]:
        ok = [c for c in self.calls if c.outcome == Outcome.SUCCESS]
        ttfts = sorted(c.ttft_s for c in ok if c.ttft_s is not None)
        prompt = sum(c.prompt_tokens for c in ok)
        succeeded = sum(1 for t in self.tasks if t.status == TaskStatus.SUCCEEDED)

        def pct(p: float) -> float | None:
            return ttfts[min(len(ttfts) - 1, int(p * len(ttfts)))] if ttfts else None

        return {
            "calls": len(self.calls), "calls_ok": len(ok), "tasks": len(self.tasks), "tasks_succeeded": succeeded,
            "ttft_p50_s": pct(0.5), "ttft_p99_s": pct(0.99),
            "prefix_hit_ratio": (sum(c.cached_tokens for c in ok) / prompt) if prompt else 0.0,
            "end_s": self.end_s, "fleet_cost_usd": self.fleet_cost_usd,
            "attempt_cost_usd": sum(c.cost_usd for c in self.calls),
        }
