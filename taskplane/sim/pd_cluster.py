"""The cluster simulator with prefill/decode disaggregation (:mod:`taskplane.sim.pd`).

:class:`DisaggSim` is :class:`~taskplane.sim.cluster.ClusterSim` plus the two legs of a
disaggregated call: a placed call whose decision names a ``prefill_replica`` runs its
prompt there first (one token out); when that ends its KV moves over the link
(:class:`~taskplane.sim.pd.LinkSpec`) and lands in the decode replica's cache, and the call
is submitted there. Its TTFT is prefill queue + prefill + transfer + the first decode step.
A call without ``prefill_replica`` runs exactly as in the plain simulator.

Given a :class:`~taskplane.autoscale.roles.RolePlanner`, the fleet's prefill/decode split
follows the load (:mod:`taskplane.sim.pd_roles`); without one the roles stay as specified.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from taskplane.autoscale.roles import RolePlanner
from taskplane.scheduler.types import Decision
from taskplane.sim.calls import SimCall, engine_request
from taskplane.sim.cluster import ClusterSim, ClusterSpec, Policy
from taskplane.sim.events import Event
from taskplane.sim.pd import PrefillLeg, missing_blocks, prefill_request, receive_kv
from taskplane.sim.pd_roles import RoleDriver, RoleTick
from taskplane.sim.requests import Finished
from taskplane.sim.results import ClusterResult
from taskplane.sim.workloads.base import Workload
from taskplane.store.records import Outcome


class DisaggSim(ClusterSim):
    """A cluster run whose policy may split calls into a prefill and a decode leg
    (and, with ``roles``, whose replicas change role as the planner decides)."""

    def __init__(self, cluster: ClusterSpec, workload: Workload, policy: Policy, *,
                 roles: RolePlanner | None = None, **kw: Any) -> None:
        super().__init__(cluster, workload, policy, **kw)
        self.roles = RoleDriver(roles, self.fleet) if roles is not None else None
        if self.roles is not None:
            self.events.push(self.roles.interval_s, Event.CONTROL, RoleTick())

    def run(self) -> ClusterResult:
        res = super().run()
        if self.roles is None:
            return res
        return dataclasses.replace(res, role_moves=list(self.roles.moves),
                                   mean_prefill_replicas=round(self.roles.prefill_share(res.end_s), 3))

    def _role_tick(self, t: float) -> None:
        """The planner's turn; the next one while any task is still to end."""
        assert self.roles is not None
        self.roles.tick(t)
        if any(task.status is None for task in self.tasks):
            self.events.push(t + self.roles.interval_s, Event.CONTROL, RoleTick())

    def _submit(self, call: SimCall, d: Decision, i: int, t: float) -> None:
        call.prefill_replica, call.transfer_s, call.transferred_tokens, call.prefill_cost = -1, 0.0, 0, 0.0
        p = self.fleet.find(d.prefill_replica) if d.prefill_replica else None
        if p is None or not self.fleet.healthy[p]:
            super()._submit(call, d, i, t)
            return
        call.prefill_replica = p
        req = engine_request(call, self.bs, with_tokens=self.policy.on_kv is not None)
        self.fleet.engines[p].submit(prefill_request(req, PrefillLeg(call, i, p)), t)
        self.fleet.mark(p)
        self._schedule_wake(p)

    def _finished(self, i: int, ev: Finished) -> None:
        leg = ev.tag
        if not isinstance(leg, PrefillLeg):
            super()._finished(i, ev)
            return
        call = leg.call
        cost = ev.gpu_seconds * self.fleet.prices[i] / 3600.0
        if ev.error is not None:
            call.prefill_replica = -1
            self._record(call, ev.time, Outcome.ERROR, "replica_error", replica=i, cost=cost + call.prefill_cost)
            self.lifecycle.retry_or_fail(call, ev.time, 0.0, "replica_error", avoid=self.fleet.name(i))
            return
        call.prefill_cost += cost
        # the decode side pulls only the blocks it lacks (vLLM's NixlConnector after its local prefix hit)
        n = missing_blocks(self.fleet.engines[leg.decode], call.hashes[: call.n_prompt_blocks])
        call.transferred_tokens = n * self.bs
        call.transfer_s = self.cluster.link.transfer_s(call.transferred_tokens, call.task.spec.model)
        self.events.push(ev.time + call.transfer_s, Event.CONTROL, leg)

    def _control(self, payload: Any, t: float) -> None:
        if isinstance(payload, RoleTick):
            self._role_tick(t)
            return
        if not isinstance(payload, PrefillLeg):
            return
        call, i = payload.call, payload.decode
        if call.task.status is not None:
            return
        if not self.fleet.healthy[i]:
            self._record(call, t, Outcome.ERROR, "replica_error", replica=i)
            self.lifecycle.retry_or_fail(call, t, 0.0, "replica_error", avoid=self.fleet.name(i))
            return
        eng = self.fleet.engines[i]
        req = engine_request(call, self.bs, with_tokens=self.policy.on_kv is not None)
        receive_kv(eng, req, t)
        eng.submit(req, t)
        self.fleet.mark(i)
        self._engine_events(i, eng.advance(t), t)
        self._schedule_wake(i)


def simulate_pd(cluster: ClusterSpec, workload: Workload, policy: Policy, **kw: Any) -> ClusterResult:
    """Run ``workload`` on a fleet with prefill-role replicas (see :class:`DisaggSim`)."""
    return DisaggSim(cluster, workload, policy, **kw).run()
