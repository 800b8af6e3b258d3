"""Plain data crossing the autoscaler boundary: signals in, a plan out.

Like the scheduler, the autoscaler is a pure core: the live dev stack, the Kubernetes
actuator and the virtual-time simulator all build a :class:`PoolSignals` per pool and get
back a :class:`Plan`. Nothing here knows how a replica is started or stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Phase(StrEnum):
    """A replica's life cycle as the autoscaler drives it."""

    STARTING = "starting"  # provisioned (paid for), loading weights: no placements yet
    READY = "ready"  # takes placements
    CORDONED = "cordoned"  # no new sessions; its pinned sessions may still run their next steps
    DRAINING = "draining"  # no placements at all; calls in flight finish, then it stops (or sleeps)
    # vLLM sleep mode: still provisioned (its GPU is held and paid for), no placements, no KV;
    # a wake is its cold start (Generation.wake_s), back through STARTING
    SLEEPING = "sleeping"


@dataclass(slots=True)
class ReplicaState:
    """One provisioned replica of a pool, as the autoscaler sees it."""

    name: str
    gpu: str
    phase: Phase = Phase.READY
    cost_per_hour_usd: float = 0.0
    started_s: float = 0.0  # when it was provisioned (its price runs from here)
    ready_s: float | None = None  # when it took its first placement (None: still starting)
    phase_since_s: float = 0.0  # when it entered its current phase
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0  # active KV blocks / total (vllm:kv_cache_usage_perc)
    # sessions pinned here that still have steps to run: their context would be
    # re-prefilled elsewhere if this replica went away
    live_sessions: int = 0
    live_session_tokens: int = 0
    # other base models the replica hosts asleep (vLLM sleep mode, one engine each): it can
    # serve one of them after a swap (seconds) instead of a new replica's cold start
    models_asleep: frozenset[str] = frozenset()

    @property
    def inflight(self) -> int:
        return self.num_running + self.num_waiting


@dataclass(frozen=True, slots=True)
class Generation:
    """What one GPU generation costs and how fast it is, for one pool's model."""

    gpu: str
    cost_per_hour_usd: float
    cold_start_s: float  # provisioning to first placement (weights + engine start)
    # a sleeping replica's wake to first placement (vLLM sleep mode's hot start); None: the pool
    # does not put replicas to sleep
    wake_s: float | None = None
    relative_speed: float = 1.0  # work per second relative to the pool's reference GPU
    # work units (see :func:`work_units`) per second one replica serves within the SLO, for
    # the pool's model and mix (profiled, as Dynamo's planner profiles before deployment)
    capacity_per_s: float = 1000.0
    max_replicas: int = 1_000_000
    meets_slo: bool = True  # False: too slow for the pool's latency target (never added)


@dataclass(slots=True)
class WorkflowSignal:
    """One workflow in flight (only taskplane sees these: the gateway's headers)."""

    task_id: str
    agent: str
    steps_remaining: int
    budget_s: float | None = None  # deadline slack: seconds left until its deadline
    replica: str | None = None  # where its session's KV lives (its last placement)
    context_tokens: int = 0


#: a prompt token computed costs about this many decode tokens (prefill runs ~8x faster per token)
PREFILL_WEIGHT = 0.125


def work_units(uncached_prompt_tokens: int, completion_tokens: int) -> float:
    """A call's GPU work in decode-token equivalents: independent of batching, unlike GPU-seconds."""
    return completion_tokens + PREFILL_WEIGHT * uncached_prompt_tokens


@dataclass(slots=True)
class AgentProfile:
    """Learned from task history: what one step of an agent costs and lasts."""

    work_per_step: float  # work units (see :func:`work_units`) per call
    seconds_per_step: float  # call + tool gap, wall time between two steps
    steps_per_task: float | None = None  # calls per finished task (None: no history yet)


@dataclass(slots=True)
class PoolSignals:
    """Everything an autoscaler may read about one pool (one model) at one moment."""

    pool: str
    now_s: float
    replicas: list[ReplicaState]
    generations: list[Generation]
    min_replicas: int = 0
    max_replicas: int = 1_000_000
    held_requests: int = 0  # calls held by the gateway while the pool has no ready replica
    queued_requests: int = 0  # calls in the gateway's admission queue (flow control), held ones included
    workflows: list[WorkflowSignal] = field(default_factory=list)
    arrivals_per_s: float = 0.0  # new workflows per second (recent rate)
    profiles: dict[str, AgentProfile] = field(default_factory=dict)
    default_profile: AgentProfile | None = None

    def active(self) -> list[ReplicaState]:
        """Replicas that count towards capacity (starting or serving, not leaving)."""
        return [r for r in self.replicas if r.phase in (Phase.STARTING, Phase.READY)]

    def sleeping(self) -> list[ReplicaState]:
        """Replicas asleep: paid for, no capacity until woken."""
        return [r for r in self.replicas if r.phase is Phase.SLEEPING]


@dataclass(slots=True)
class Plan:
    """What to do now, with the reasons (metrics and log lines carry them)."""

    pool: str
    desired: int  # replicas the pool should have once the plan is carried out
    start: list[str] = field(default_factory=list)  # GPU generation of each replica to add
    cordon: list[str] = field(default_factory=list)  # replicas: no new sessions
    uncordon: list[str] = field(default_factory=list)  # back to READY (demand came back)
    drain: list[str] = field(default_factory=list)  # replicas: no placements, stop (or sleep) when empty
    wake: list[str] = field(default_factory=list)  # sleeping replicas to wake (a hot start)
    # ready replicas that take no new session (the next scale-in victim) but still serve and
    # count as capacity; None: unchanged since the last plan
    predrain: list[str] | None = None
    # seconds a draining replica's calls in flight get before it is killed (None: wait for
    # them, however long: taskplane never fails a call in flight)
    grace_s: float | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.start or self.cordon or self.uncordon or self.drain or self.wake)
