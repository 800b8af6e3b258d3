"""One pool's replica life cycles, shared by every actuator (simulator, dev stack, Kubernetes).

The autoscaler says *what* (start a generation, cordon, drain); this book keeps each
replica's phase, decides *when* a draining replica may stop (its calls in flight are done,
or its grace period is over), and records every provisioned interval: the fleet-hours rows
that make cost per successful task fully loaded (idle GPU-hours included).

With vLLM sleep mode (``sleep_level`` 1 or 2) a drained replica may be put to sleep
(:meth:`FleetBook.slept`) instead of stopped: its interval stays open, since a sleeping
replica still holds its GPU, and a wake takes it back through ``starting``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from taskplane.autoscale.types import Generation, Phase, Plan, ReplicaState


@dataclass(slots=True)
class FleetInterval:
    """A replica provisioned from ``started_s`` to ``stopped_s`` (a fleet_hours row)."""

    pool: str
    replica: str
    gpu: str
    cost_per_hour_usd: float
    started_s: float
    ready_s: float | None
    stopped_s: float | None  # None: still provisioned
    stop_reason: str | None = None
    killed_inflight: int = 0  # calls in flight when it stopped (a kill fails them)

    def hours(self, now_s: float) -> float:
        end = self.stopped_s if self.stopped_s is not None else now_s
        return max(0.0, end - self.started_s) / 3600.0


@dataclass(slots=True)
class Actions:
    """What the actuator must do after a plan (names are the book's)."""

    start: list[tuple[str, str]] = field(default_factory=list)  # (replica, gpu)
    wake: list[str] = field(default_factory=list)  # sleeping replicas to wake (now starting)
    stop: list[tuple[str, bool]] = field(default_factory=list)  # (replica, kill calls in flight)
    unplaceable: list[str] = field(default_factory=list)  # drop from placement now


class FleetBook:
    def __init__(self, pool: str, generations: list[Generation],
                 namer: Callable[[str], str] | None = None, *, sleep_level: int = 0) -> None:
        self.pool = pool
        self.sleep_level = sleep_level  # a drained replica sleeps at this vLLM level (0: it stops)
        self.namer = namer  # names a new replica of a generation (the simulator: a free slot)
        self.generations = {g.gpu: g for g in generations}
        self.replicas: dict[str, ReplicaState] = {}
        self.intervals: dict[str, FleetInterval] = {}
        self.closed: list[FleetInterval] = []
        self._kill_at: dict[str, float | None] = {}
        self._seq = 0
        self.predrained: set[str] = set()  # ready, serving, but no new session (the next victim)

    # ---------------------------------------------------------------- adding
    def provision(self, gpu: str, now_s: float, *, name: str | None = None, ready: bool = False) -> str:
        """A replica paid for from ``now_s`` (``ready``: it serves at once, e.g. at boot)."""
        if name is None and self.namer is not None:
            name = self.namer(gpu)
        if name is None:
            self._seq += 1
            name = f"{self.pool}-{gpu}-{self._seq}"
        g = self.generations[gpu]
        phase = Phase.READY if ready else Phase.STARTING
        self.replicas[name] = ReplicaState(name=name, gpu=gpu, phase=phase, cost_per_hour_usd=g.cost_per_hour_usd,
                                           started_s=now_s, ready_s=now_s if ready else None, phase_since_s=now_s)
        self.intervals[name] = FleetInterval(self.pool, name, gpu, g.cost_per_hour_usd, now_s,
                                             now_s if ready else None, None)
        return name

    def mark_ready(self, name: str, now_s: float) -> None:
        r = self.replicas.get(name)
        if r is None or r.phase is not Phase.STARTING:
            return
        r.phase, r.ready_s, r.phase_since_s = Phase.READY, now_s, now_s
        iv = self.intervals[name]
        if iv.ready_s is None:  # a woken replica keeps its first ready time
            iv.ready_s = now_s

    # ---------------------------------------------------------------- plans
    def apply(self, plan: Plan, now_s: float) -> Actions:
        acts = Actions()
        for gpu in plan.start:
            acts.start.append((self.provision(gpu, now_s), gpu))
        if plan.predrain is not None:
            self.predrained = set(plan.predrain)
        for name in plan.cordon:
            self._set(name, Phase.CORDONED, now_s, {Phase.READY})
        for name in plan.uncordon:
            self._set(name, Phase.READY, now_s, {Phase.CORDONED})
        for name in plan.wake:
            r = self.replicas.get(name)
            if r is not None and r.phase is Phase.SLEEPING:
                r.phase, r.phase_since_s, r.ready_s = Phase.STARTING, now_s, None
                acts.wake.append(name)
        for name in plan.drain:
            r = self.replicas.get(name)
            if r is None or r.phase is Phase.DRAINING:
                continue
            if r.phase in (Phase.STARTING, Phase.SLEEPING):  # nothing to drain: it serves nothing
                acts.stop.append((name, False))
                continue
            self._set(name, Phase.DRAINING, now_s, {Phase.READY, Phase.CORDONED})
            self._kill_at[name] = None if plan.grace_s is None else now_s + plan.grace_s
            acts.unplaceable.append(name)
        return acts

    def _set(self, name: str, phase: Phase, now_s: float, allowed: set[Phase]) -> None:
        r = self.replicas.get(name)
        if r is not None and r.phase in allowed:
            r.phase, r.phase_since_s = phase, now_s

    def due(self, now_s: float) -> list[tuple[str, bool]]:
        """Draining replicas to stop now: (name, kill) — kill when calls are still in flight."""
        out = []
        for name, r in self.replicas.items():
            if r.phase is not Phase.DRAINING:
                continue
            kill_at = self._kill_at.get(name)
            if r.inflight == 0:
                out.append((name, False))
            elif kill_at is not None and now_s >= kill_at:
                out.append((name, True))
        return out

    def slept(self, name: str, now_s: float) -> None:
        """The drained replica is asleep (vLLM sleep mode): no placements, no KV, still paid for."""
        r = self.replicas.get(name)
        if r is not None and r.phase is Phase.DRAINING:
            r.phase, r.phase_since_s = Phase.SLEEPING, now_s
            r.num_running = r.num_waiting = r.live_sessions = r.live_session_tokens = 0
            r.kv_usage = 0.0
            self._kill_at.pop(name, None)

    def stopped(self, name: str, now_s: float, *, reason: str, killed_inflight: int = 0) -> FleetInterval | None:
        """The replica is gone: close its interval (its price stops here)."""
        self.replicas.pop(name, None)
        self._kill_at.pop(name, None)
        iv = self.intervals.pop(name, None)
        if iv is None:
            return None
        iv.stopped_s, iv.stop_reason, iv.killed_inflight = now_s, reason, killed_inflight
        self.closed.append(iv)
        return iv

    # ---------------------------------------------------------------- reading
    def placeable(self, name: str) -> bool:
        """May take any new placement (new sessions included)."""
        r = self.replicas.get(name)
        return r is not None and r.phase is Phase.READY

    def takes_new_sessions(self, name: str) -> bool:
        """May have a new session pinned: ready and not pre-drained."""
        return self.placeable(name) and name not in self.predrained

    def closed_to_new_sessions(self) -> list[str]:
        """Serving replicas that take only their own sessions' calls: cordoned or pre-drained."""
        return [n for n, r in self.replicas.items()
                if r.phase is Phase.CORDONED or (r.phase is Phase.READY and n in self.predrained)]

    def serving(self, name: str) -> bool:
        """May take its own pinned sessions' calls (ready or cordoned)."""
        r = self.replicas.get(name)
        return r is not None and r.phase in (Phase.READY, Phase.CORDONED)

    def all_intervals(self) -> list[FleetInterval]:
        return [*self.closed, *self.intervals.values()]

    def gpu_hours(self, now_s: float) -> float:
        return sum(iv.hours(now_s) for iv in self.all_intervals())

    def cost_usd(self, now_s: float) -> float:
        return sum(iv.hours(now_s) * iv.cost_per_hour_usd for iv in self.all_intervals())
