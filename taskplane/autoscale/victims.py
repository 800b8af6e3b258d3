"""Which replica to give up on scale-in.

Kubernetes, asked to shrink a ReplicaSet, deletes pods in its own order (lowest
``controller.kubernetes.io/pod-deletion-cost`` first, then not-ready before ready, then the
most recently ready): it knows nothing of KV caches. taskplane picks the replica whose loss
re-prefills the fewest tokens of sessions still alive, and hands the order to Kubernetes as
deletion costs.
"""

from __future__ import annotations

from taskplane.autoscale.types import Phase, ReplicaState


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


def deletion_costs(replicas: list[ReplicaState]) -> dict[str, int]:
    """``pod-deletion-cost`` per replica: Kubernetes deletes the lowest first, so the cost is
    the re-prefill cost (clamped to the annotation's int32 range)."""
    return {r.name: min(reprefill_cost(r), 2**31 - 1) for r in replicas}
