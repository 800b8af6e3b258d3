"""The role planner (:mod:`taskplane.autoscale.roles`) driving a simulated disaggregated fleet.

Every ``interval_s`` of virtual time the planner reads each prefill- and decode-role
replica's view -- what the policy itself reads: running and waiting requests, free KV
blocks, the prompt tokens placed there and not yet computed -- never the engines' inner
state. A move relabels the replica's view: the next placement sees the new role (the
routing policies read ``ReplicaView.role`` through the table's pools), and the requests the
engine already runs finish there. Under vLLM's NIXL connector with ``kv_role: kv_both`` a
role is a routing label, so the flip needs no restart, and none is simulated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from taskplane.autoscale.roles import (
    BOTH,
    DECODE,
    PREFILL,
    ReplicaLoad,
    RoleMove,
    RolePlanner,
    RoleSignals,
)
from taskplane.scheduler.types import ReplicaView
from taskplane.sim.replicas import SimReplicas


@dataclass(frozen=True, slots=True)
class RoleTick:
    """The planner's turn (an ``Event.CONTROL`` payload)."""


def replica_load(v: ReplicaView) -> ReplicaLoad:
    """A replica's observable load, from the view the policy reads."""
    used = 1.0 - v.kv_blocks_free / v.kv_blocks_total if v.kv_blocks_total else 0.0
    return ReplicaLoad(name=v.name, role=v.role, num_running=v.num_running, num_waiting=v.num_waiting,
                       prefill_tokens=float(v.inflight_prefill_tokens), kv_usage=used)


class RoleDriver:
    """Runs :class:`RolePlanner` over a :class:`SimReplicas` and applies its moves."""

    def __init__(self, planner: RolePlanner, fleet: SimReplicas) -> None:
        self.planner = planner
        self.fleet = fleet
        self.moves: list[tuple[float, str, str]] = []  # (time, replica, new role)

    @property
    def interval_s(self) -> float:
        return self.planner.config.interval_s

    def tick(self, t: float) -> RoleMove | None:
        """One plan at ``t``; the move (if any) is applied before the next placement."""
        fleet = self.fleet
        fleet.snapshot()
        loads = [replica_load(v) for v, ok in zip(fleet.views, fleet.healthy, strict=True)
                 if ok and v.role in (PREFILL, DECODE, BOTH)]
        move = self.planner.plan(RoleSignals(now_s=t, replicas=loads))
        if move is not None:
            i = fleet.find(move.replica)
            assert i is not None
            # a new view object: the table notices the role change and rebuilds its pools
            fleet.views[i] = dataclasses.replace(fleet.views[i], role=move.role)
            fleet.mark(i)
            self.moves.append((t, move.replica, move.role))
        return move

    def prefill_share(self, end_s: float) -> float:
        """Time-weighted mean number of prefill-role replicas up to ``end_s`` (a lent one is "both")."""
        n = sum(1 for v in self.fleet.views if v.role == PREFILL)
        for _, _, role in self.moves:  # unwind to the start
            n += -1 if role == PREFILL else 1
        total, last = 0.0, 0.0
        for t, _, role in self.moves:
            total += n * (t - last)
            n, last = n + (1 if role == PREFILL else -1), t
        total += n * (end_s - last)
        return total / end_s if end_s > 0 else float(n)
