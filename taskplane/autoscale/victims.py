"""Which replica to give up on scale-in, and when a cordoned one should stop waiting.

Kubernetes, asked to shrink a ReplicaSet, deletes pods in its own order (lowest
``controller.kubernetes.io/pod-deletion-cost`` first, then not-ready before ready, then the
most recently ready): it knows nothing of KV caches. taskplane picks the replica whose
pinned sessions are expected to finish soonest (the prediction layer's steps remaining
times the agent's seconds per step), so a cordon is short, and among equals the one whose
loss re-prefills the fewest live tokens; it hands the order to Kubernetes as deletion costs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from taskplane.autoscale.types import (
    PREFILL_WEIGHT,
    AgentProfile,
    Phase,
    ReplicaState,
    WorkflowSignal,
)


def kube_default(replicas: list[ReplicaState], n: int) -> list[str]:
    """Kubernetes' default scale-down order: starting pods first, then the newest ready."""
    order = sorted(replicas, key=lambda r: (r.phase is not Phase.STARTING, -(r.ready_s or r.started_s), r.name))
    return [r.name for r in order[:n]]


def reprefill_cost(replica: ReplicaState) -> int:
    """Tokens that would be prefilled again elsewhere if this replica went away now."""
    return replica.live_session_tokens


def fewest_reprefill(replicas: list[ReplicaState], n: int) -> list[str]:
    """The replicas whose loss re-prefills the fewest live-session tokens; a starting one
    (no cache yet) first, then the fewest calls in flight, then the dearest to keep."""
    order = sorted(replicas, key=lambda r: (r.phase is not Phase.STARTING, reprefill_cost(r), r.inflight,
                                            -r.cost_per_hour_usd, r.name))
    return [r.name for r in order[:n]]


def drain_seconds(workflows: Iterable[WorkflowSignal], profile: Callable[[WorkflowSignal], AgentProfile]
                  ) -> dict[str, float]:
    """Per replica, the predicted seconds until the last session pinned there ends: its
    workflows' steps remaining times their agents' seconds per step (the longest one)."""
    out: dict[str, float] = {}
    for w in workflows:
        if w.replica is None or w.steps_remaining <= 0:
            continue
        left = w.steps_remaining * profile(w).seconds_per_step
        out[w.replica] = max(out.get(w.replica, 0.0), left)
    return out


def soonest_drained(replicas: list[ReplicaState], n: int, drain_s: dict[str, float]) -> list[str]:
    """The replicas whose pinned sessions are expected to end first (``drain_s``, from
    :func:`drain_seconds`); a starting one first; then the fewest tokens to re-prefill."""
    order = sorted(replicas, key=lambda r: (r.phase is not Phase.STARTING, round(drain_s.get(r.name, 0.0)),
                                            reprefill_cost(r), r.inflight, -r.cost_per_hour_usd, r.name))
    return [r.name for r in order[:n]]


def reprefill_gpu_seconds(tokens: int, capacity_per_s: float) -> float:
    """GPU-seconds that re-prefilling ``tokens`` elsewhere costs (prefill work units over one
    replica's profiled work per second)."""
    return tokens * PREFILL_WEIGHT / max(capacity_per_s, 1e-9)


def deletion_costs(replicas: list[ReplicaState]) -> dict[str, int]:
    """``pod-deletion-cost`` per replica: Kubernetes deletes the lowest first, so the cost is
    the re-prefill cost (clamped to the annotation's int32 range)."""
    return {r.name: min(reprefill_cost(r), 2**31 - 1) for r in replicas}
