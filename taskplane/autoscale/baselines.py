"""The autoscalers the field runs, as documented, to compare taskplane's against.

- ``fixed-peak``: as many replicas as the peak needs, all day.
Queues are the engines' waiting requests plus the gateway's admission queue (what llm-d's
flow control exports), so a baseline sees the load taskplane's admission holds back.

- ``hpa-queue``: the Kubernetes HPA (or KEDA) on waiting requests per replica: desired =
  ceil(ready x metric / target) with a 10 % tolerance, a 15 s sync period, scale-up at most
  doubling (or +4 pods) per period, a 300 s scale-down stabilization window; victims in
  Kubernetes' default order; a deleted pod's calls get the 30 s termination grace period.
- ``dynamo-planner``: NVIDIA Dynamo's planner in load mode: engine metrics sampled every
  5 s, averaged over the adjustment interval (30 s); a replica added when KV usage or the
  waiting queue passes its scale-up threshold, one removed under the scale-down thresholds;
  the removed worker is terminated without waiting for its requests in flight.
- ``aibrix-kpa``: AIBrix's KPA (Knative's algorithm) on concurrency per replica: a 60 s
  stable window and a 6 s panic window; panic when the panic window asks for twice the ready
  replicas, no scale-down while panicking; scale-down at most halves; Kubernetes victims and
  grace period.

All add the pool's first generation (none is price-aware) and are pure: signals in, plan out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from taskplane.autoscale.types import Phase, Plan, PoolSignals, ReplicaState
from taskplane.autoscale.victims import fewest_reprefill, kube_default

KUBE_GRACE_S = 30.0  # terminationGracePeriodSeconds' default


def clamp(n: int, s: PoolSignals) -> int:
    return max(s.min_replicas, min(s.max_replicas, n))


def free_slots(s: PoolSignals) -> int:
    """GPUs of the first generation a new replica can take now. Draining, cordoned and
    sleeping replicas still hold theirs: as a Kubernetes pod scaled up beside terminating
    ones stays Pending until a GPU frees, the rest of a scale-out waits for a later plan."""
    gen = s.generations[0]
    of_gen = sum(1 for r in s.replicas if r.gpu == gen.gpu)
    return max(0, min(s.max_replicas - len(s.replicas), gen.max_replicas - of_gen))


def resize(s: PoolSignals, desired: int, *, grace_s: float | None, reason: str,
           victims: str = "kube") -> Plan:
    """A plan taking the pool from its active replicas to ``desired``: add the first
    generation, or drain victims in Kubernetes' order."""
    active = s.active()
    plan = Plan(pool=s.pool, desired=desired, grace_s=grace_s)
    if desired > len(active):
        new = min(desired - len(active), free_slots(s))
        plan.start = [s.generations[0].gpu] * new
        plan.reasons.append(f"scale out {len(active)}->{desired}: {reason}"
                            + (f" ({desired - len(active) - new} wait for a GPU)" if new < desired - len(active) else ""))
    elif desired < len(active):
        pick = kube_default if victims == "kube" else fewest_reprefill
        plan.drain = pick(active, len(active) - desired)
        plan.reasons.append(f"scale in {len(active)}->{desired}: {reason}")
    return plan


def ready(s: PoolSignals) -> list[ReplicaState]:
    return [r for r in s.replicas if r.phase is Phase.READY]


class FixedPeak:
    """The peak fleet, always (what a static gateway config is)."""

    name = "fixed-peak"

    def __init__(self, replicas: int | None = None) -> None:
        self.replicas = replicas

    def plan(self, s: PoolSignals) -> Plan:
        n = self.replicas if self.replicas is not None else s.max_replicas
        return resize(s, clamp(n, s), grace_s=KUBE_GRACE_S, reason="fixed fleet")


@dataclass(slots=True)
class HpaConfig:
    target_waiting_per_replica: float = 2.0  # KEDA trigger on vllm:num_requests_waiting
    tolerance: float = 0.1  # --horizontal-pod-autoscaler-tolerance
    sync_s: float = 15.0  # --horizontal-pod-autoscaler-sync-period
    scale_down_window_s: float = 300.0  # behavior.scaleDown.stabilizationWindowSeconds
    scale_up_pods: int = 4  # behavior.scaleUp policies: max(+100 %, +4 pods) per 15 s


class HpaQueue:
    name = "hpa-queue"

    def __init__(self, config: HpaConfig | None = None) -> None:
        self.cfg = config or HpaConfig()
        self._recs: deque[tuple[float, int]] = deque()
        self._last = -math.inf

    def plan(self, s: PoolSignals) -> Plan:
        cfg = self.cfg
        active = s.active()
        if s.now_s - self._last < cfg.sync_s:
            return Plan(pool=s.pool, desired=len(active))
        self._last = s.now_s
        rdy = ready(s)
        cur = len(active)
        if not rdy:  # no metric from a pool without pods: the held calls wake it (KEDA's activation)
            want = max(cur, 1 if s.held_requests else 0)
            return resize(s, clamp(want, s), grace_s=KUBE_GRACE_S, reason="activation on held requests")
        metric = (sum(r.num_waiting for r in rdy) + s.queued_requests) / len(rdy)
        ratio = metric / cfg.target_waiting_per_replica
        desired = cur if abs(ratio - 1.0) <= cfg.tolerance else math.ceil(len(rdy) * ratio)
        desired = min(desired, max(2 * cur, cur + cfg.scale_up_pods))
        self._recs.append((s.now_s, desired))
        while self._recs and self._recs[0][0] < s.now_s - cfg.scale_down_window_s:
            self._recs.popleft()
        if desired < cur:  # scale down to the highest recommendation of the window
            desired = min(cur, max(d for _, d in self._recs))
        return resize(s, clamp(desired, s), grace_s=KUBE_GRACE_S,
                      reason=f"waiting/replica {metric:.2f} vs target {cfg.target_waiting_per_replica}")


@dataclass(slots=True)
class DynamoConfig:
    sample_s: float = 5.0  # engine metrics sampled this often
    adjustment_interval_s: float = 30.0
    kv_scale_up: float = 0.9  # --decode-kv-scale-up-threshold
    kv_scale_down: float = 0.5  # --decode-kv-scale-down-threshold
    queue_scale_up: float = 5.0  # --prefill-queue-scale-up-threshold (waiting per replica)
    queue_scale_down: float = 0.2  # --prefill-queue-scale-down-threshold


class DynamoPlanner:
    name = "dynamo-planner"

    def __init__(self, config: DynamoConfig | None = None) -> None:
        self.cfg = config or DynamoConfig()
        self._samples: list[tuple[float, float]] = []
        self._last_sample = -math.inf
        self._last_adjust = -math.inf

    def plan(self, s: PoolSignals) -> Plan:
        cfg = self.cfg
        rdy = ready(s)
        cur = len(s.active())
        if s.now_s - self._last_sample >= cfg.sample_s and rdy:
            self._last_sample = s.now_s
            waiting = sum(r.num_waiting for r in rdy) + s.queued_requests
            self._samples.append((sum(r.kv_usage for r in rdy) / len(rdy), waiting / len(rdy)))
        if not rdy and s.held_requests and cur == 0:
            return resize(s, clamp(1, s), grace_s=0.0, reason="held requests on an empty pool")
        if s.now_s - self._last_adjust < cfg.adjustment_interval_s or not self._samples:
            return Plan(pool=s.pool, desired=cur)
        self._last_adjust = s.now_s
        kv = sum(k for k, _ in self._samples) / len(self._samples)
        queue = sum(q for _, q in self._samples) / len(self._samples)
        self._samples.clear()
        desired = cur
        if kv > cfg.kv_scale_up or queue > cfg.queue_scale_up:
            desired = cur + 1
        elif kv < cfg.kv_scale_down and queue < cfg.queue_scale_down:
            desired = cur - 1
        return resize(s, clamp(desired, s), grace_s=0.0, reason=f"kv {kv:.2f}, waiting/replica {queue:.2f}")


@dataclass(slots=True)
class KpaConfig:
    target_concurrency: float = 32.0  # running + waiting requests per replica
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0  # 10 % of the stable window
    panic_threshold: float = 2.0  # 200 %
    max_scale_down_rate: float = 2.0
    tick_s: float = 2.0  # metric scrape period


class AibrixKpa:
    name = "aibrix-kpa"

    def __init__(self, config: KpaConfig | None = None) -> None:
        self.cfg = config or KpaConfig()
        self._obs: deque[tuple[float, float]] = deque()
        self._panic_until = -math.inf
        self._last = -math.inf

    def plan(self, s: PoolSignals) -> Plan:
        cfg = self.cfg
        cur = len(s.active())
        if s.now_s - self._last < cfg.tick_s:
            return Plan(pool=s.pool, desired=cur)
        self._last = s.now_s
        total = float(sum(r.inflight for r in ready(s)) + s.queued_requests)
        self._obs.append((s.now_s, total))
        while self._obs and self._obs[0][0] < s.now_s - cfg.stable_window_s:
            self._obs.popleft()
        stable = sum(v for _, v in self._obs) / len(self._obs)
        recent = [v for t, v in self._obs if t >= s.now_s - cfg.panic_window_s]
        panic = sum(recent) / len(recent)
        want_stable = math.ceil(stable / cfg.target_concurrency)
        want_panic = math.ceil(panic / cfg.target_concurrency)
        n_ready = max(len(ready(s)), 1)
        if want_panic / n_ready >= cfg.panic_threshold:
            self._panic_until = s.now_s + cfg.stable_window_s
        if s.now_s < self._panic_until:
            desired = max(want_panic, cur)
        else:
            desired = max(want_stable, math.floor(cur / cfg.max_scale_down_rate))
        return resize(s, clamp(desired, s), grace_s=KUBE_GRACE_S,
                      reason=f"concurrency stable {stable:.1f} panic {panic:.1f} target {cfg.target_concurrency}")
