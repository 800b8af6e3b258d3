"""Per-role planning for a disaggregated fleet: how many replicas prefill, how many decode.

A prefill/decode split fixed at start cannot follow an agent mix whose prompt-heavy and
decode-heavy phases come and go: its prefill replicas idle while decode replicas queue,
or the reverse. :class:`RolePlanner` is the per-role half of an SLA planner (as NVIDIA
Dynamo's planner scales prefill and decode workers separately), for a fleet of fixed size:
each interval it reads what a live system knows of every replica -- the uncached prompt
tokens queued on it (the scheduler's in-flight prefill bookkeeping), its running and
waiting requests (``vllm:num_requests_running`` / ``_waiting``) and its KV use
(``vllm:kv_cache_usage_perc``) -- and moves at most one replica from one role to the other.

A move is a label change, not a restart: with vLLM's NIXL connector and
``kv_role: kv_both`` every replica can both produce and consume KV, so the role only
says where the router sends new work. The moved replica finishes what it runs.

Pure and synchronous, like the scheduler: the simulator and a live loop feed it
:class:`RoleSignals` and apply the :class:`RoleMove` it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PREFILL, DECODE, BOTH = "prefill", "decode", "both"


@dataclass(frozen=True, slots=True)
class RolePlannerConfig:
    """When a replica changes role. Defaults suit an 8B model on H100s (~25k prefill tokens/s)."""

    #: seconds between two plans
    interval_s: float = 10.0
    #: prompt tokens one prefill-role replica computes per second (profiled, as Dynamo's planner is)
    prefill_tokens_per_s: float = 25_000.0
    #: queued prefill work per prefill replica, seconds, above which the prefill side needs a replica
    prefill_high_s: float = 0.5
    #: ... and below which (counted without the replica that would leave) it can give one away
    prefill_low_s: float = 0.1
    #: running + waiting requests per decode replica that count as full decode load (load 1.0)
    decode_target_seqs: float = 24.0
    #: KV use per decode replica that counts as full decode load (load 1.0)
    decode_target_kv: float = 0.8
    #: decode load above which the decode side needs a replica (and will not give one away)
    decode_high: float = 1.0
    #: decode load from which an idle prefill replica moves to decode (below it: nothing to gain)
    decode_low: float = 0.3
    #: consecutive plans a condition must hold before a replica moves (hysteresis in time)
    sustain: int = 2
    #: seconds after a move before the next one
    cooldown_s: float = 30.0
    #: minimum replicas per side (a lent replica counts as prefill: it still prefills for decode ones)
    min_prefill: int = 1
    min_decode: int = 1
    #: a prefill replica the prefill side does not need (at ``min_prefill``) serves whole calls
    #: as well ("both"): decode replicas still disaggregate onto it; it is reclaimed when the
    #: prefill queue backs up
    lend_idle_prefill: bool = False

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.prefill_tokens_per_s <= 0:
            raise ValueError("interval_s and prefill_tokens_per_s must be > 0")
        if not 0 <= self.prefill_low_s < self.prefill_high_s:
            raise ValueError("need 0 <= prefill_low_s < prefill_high_s (the hysteresis band)")
        if not 0 <= self.decode_low < self.decode_high:
            raise ValueError("need 0 <= decode_low < decode_high (the hysteresis band)")
        if self.min_prefill < 1 or self.min_decode < 1 or self.sustain < 1:
            raise ValueError("min_prefill, min_decode and sustain must be >= 1")


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One replica as the planner reads it (its metrics and the router's bookkeeping)."""

    name: str
    role: str  # "prefill", "decode" or "both" (a lent prefill replica)
    num_running: int = 0
    num_waiting: int = 0
    prefill_tokens: float = 0.0  # uncached prompt tokens placed on it and not yet computed
    kv_usage: float = 0.0  # 0..1


@dataclass(frozen=True, slots=True)
class RoleSignals:
    now_s: float
    replicas: Sequence[ReplicaLoad]


@dataclass(frozen=True, slots=True)
class RoleMove:
    """Move ``replica`` to ``role``; ``reason`` says which pressure asked for it."""

    replica: str
    role: str
    reason: str


@dataclass(frozen=True, slots=True)
class Pressure:
    """The two sides' load: prefill seconds queued per prefill-side replica (lent ones
    included), decode load per decode replica; ``lent``: prefill replicas serving whole calls."""

    n_prefill: int
    n_decode: int
    prefill_s: float
    decode: float
    lent: int = 0

    def prefill_without_one(self) -> float:
        return self.prefill_s * self.n_prefill / max(self.n_prefill - 1, 1)

    def decode_without_one(self) -> float:
        return self.decode * self.n_decode / max(self.n_decode - 1, 1)


def pressure(replicas: Sequence[ReplicaLoad], cfg: RolePlannerConfig) -> Pressure:
    """Both sides' load from the replicas' observed state (decode: the worse of seqs and KV)."""
    pre = [r for r in replicas if r.role in (PREFILL, BOTH)]
    dec = [r for r in replicas if r.role == DECODE]
    queued = sum(r.prefill_tokens for r in pre) / cfg.prefill_tokens_per_s
    seqs = sum(r.num_running + r.num_waiting for r in dec) / max(len(dec), 1) / cfg.decode_target_seqs
    kv = sum(r.kv_usage for r in dec) / max(len(dec), 1) / cfg.decode_target_kv
    return Pressure(len(pre), len(dec), queued / max(len(pre), 1), max(seqs, kv),
                    lent=sum(1 for r in pre if r.role == BOTH))


@dataclass(frozen=True, slots=True)
class Want:
    """A move the load asks for: one replica of ``source`` role becomes ``target``."""

    source: str
    target: str
    reason: str


class RolePlanner:
    """Decides, each interval, whether one replica changes role (see the module docstring)."""

    def __init__(self, config: RolePlannerConfig | None = None) -> None:
        self.config = config or RolePlannerConfig()
        self._want: tuple[str, str] | None = None  # (source, target) the last plans asked for
        self._streak = 0  # consecutive plans that asked for it
        self._last_move_s = -float("inf")
        self.last: Pressure | None = None  # the last plan's pressures (for logs and tests)

    def wanted(self, p: Pressure) -> Want | None:
        """The move the load asks for now (None: none); a lent replica is reclaimed first."""
        c = self.config
        load = f"prefill {p.prefill_s:.2f}s queued per replica, decode load {p.decode:.2f}"
        if p.prefill_s > c.prefill_high_s:
            if p.lent:
                return Want(BOTH, PREFILL, f"prefill backed up: {load}")
            if p.n_decode > c.min_decode and p.decode_without_one() < c.decode_high:
                return Want(DECODE, PREFILL, f"prefill backed up: {load}")
        can_give = p.n_prefill - p.lent > 0 and p.n_prefill > c.min_prefill
        if can_give and p.prefill_without_one() < c.prefill_high_s and p.decode > c.decode_high:
            return Want(PREFILL, DECODE, f"decode overloaded: {load}")
        if can_give and p.prefill_without_one() < c.prefill_low_s and p.decode > c.decode_low:
            return Want(PREFILL, DECODE, f"prefill idle: {load}")
        if c.lend_idle_prefill and p.n_prefill > p.lent and p.prefill_s < c.prefill_low_s and p.decode > c.decode_low:
            return Want(PREFILL, BOTH, f"prefill idle, lent to whole calls: {load}")
        return None

    def plan(self, s: RoleSignals) -> RoleMove | None:
        """At most one move: sustained for ``sustain`` plans and ``cooldown_s`` after the last."""
        c = self.config
        p = self.last = pressure(s.replicas, c)
        want = self.wanted(p)
        key = None if want is None else (want.source, want.target)
        self._streak = self._streak + 1 if key is not None and key == self._want else int(key is not None)
        self._want = key
        if want is None or self._streak < c.sustain or s.now_s - self._last_move_s < c.cooldown_s:
            return None
        donor = pick_donor(s.replicas, want.source)
        if donor is None:
            return None
        self._last_move_s, self._streak, self._want = s.now_s, 0, None
        return RoleMove(donor.name, want.target, want.reason)


def pick_donor(replicas: Sequence[ReplicaLoad], role: str) -> ReplicaLoad | None:
    """The replica of ``role`` that gives up the least: a prefill (or lent) replica with the
    least prompt work queued; a decode replica with the fewest requests (they finish where
    they are), then the least KV held (the sessions whose cache would stop being reused there)."""
    pool = [r for r in replicas if r.role == role]
    if not pool:
        return None
    if role != DECODE:
        return min(pool, key=lambda r: (r.prefill_tokens, r.num_running + r.num_waiting, r.name))
    return min(pool, key=lambda r: (r.num_running + r.num_waiting, r.kv_usage, r.name))
