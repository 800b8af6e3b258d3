"""Each LoRA adapter's predicted demand on each replica, and the unloads it calls for.

vLLM keeps ``max_loras`` adapters in GPU slots and drops the least recently used one when
another needs a slot, whatever either's demand. A picker sees, per replica, the calls of
each adapter it placed there (an exponentially decayed rate) and the sessions of it still
pinned there (a call within ``pin_window_s`` and no end reported); that is the demand
prediction. When more adapters have demand on a replica than it has GPU slots, the ones
with the lowest demand are unloaded there (``POST /v1/unload_lora_adapter``): their next
calls go to replicas that hold them rather than evicting a busier adapter's slot here.
An adapter is never unloaded where it runs, waits or has a session pinned, nor from the
last replica that serves it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from taskplane.scheduler.types import ReplicaView


@dataclass(frozen=True, slots=True)
class UnloadRule:
    half_life_s: float = 30.0  # the decay of each adapter's call rate per replica
    pin_window_s: float = 60.0  # a session whose last call there is this recent counts as pinned
    session_weight: float = 0.1  # calls per second one pinned session counts for
    max_per_plan: int = 4  # unloads one plan may ask for, at most one per replica


class ReplicaDemand:
    """Decayed call rates and live sessions per (replica, adapter), from the placements."""

    def __init__(self, rule: UnloadRule) -> None:
        self.rule = rule
        self._rate: dict[tuple[str, str], float] = {}
        self._at = 0.0
        self._sessions: dict[tuple[str, str], dict[str, float]] = {}  # -> session: last call time

    def _decay(self, now_s: float) -> None:
        if now_s > self._at:
            f = math.exp(-(now_s - self._at) * math.log(2.0) / self.rule.half_life_s)
            self._rate = {k: r * f for k, r in self._rate.items() if r * f > 1e-6}
            self._at = now_s

    def placed(self, replica: str, adapter: str, session: str | None, now_s: float) -> None:
        self._decay(now_s)
        key = (replica, adapter)
        self._rate[key] = self._rate.get(key, 0.0) + math.log(2.0) / self.rule.half_life_s
        if session:
            for k, live in self._sessions.items():  # a session lives on one replica
                if k != key:
                    live.pop(session, None)
            self._sessions.setdefault(key, {})[session] = now_s

    def ended(self, session: str) -> None:
        for live in self._sessions.values():
            live.pop(session, None)

    def pinned(self, replica: str, adapter: str, now_s: float) -> int:
        live = self._sessions.get((replica, adapter))
        if not live:
            return 0
        cutoff = now_s - self.rule.pin_window_s
        for s in [s for s, t in live.items() if t < cutoff]:
            del live[s]
        return len(live)

    def demand(self, replica: str, adapter: str, now_s: float) -> float:
        """Predicted calls per second of ``adapter`` on ``replica``."""
        self._decay(now_s)
        return self._rate.get((replica, adapter), 0.0) + self.rule.session_weight * self.pinned(replica, adapter, now_s)

    def adapters_on(self, replica: str) -> set[str]:
        return {a for r, a in self._rate if r == replica} | {a for (r, a), s in self._sessions.items() if r == replica and s}

    def forget(self, replica: str, adapter: str | None = None) -> None:
        """The replica (or one adapter there) is gone: its demand with it."""
        drop = [k for k in (*self._rate, *self._sessions) if k[0] == replica and (adapter is None or k[1] == adapter)]
        for k in drop:
            self._rate.pop(k, None)
            self._sessions.pop(k, None)

    def plan_unloads(self, views: list[ReplicaView], now_s: float) -> list[tuple[str, str]]:
        """(replica, adapter) unloads: on each replica where more adapters have demand than
        it has GPU slots, the least demanded one, if nothing protects it."""
        served: dict[str, int] = {}
        for v in views:
            for a in v.lora_served or ():
                served[a] = served.get(a, 0) + 1
        out: list[tuple[str, str]] = []
        for v in sorted(views, key=lambda v: v.name):
            if len(out) >= self.rule.max_per_plan:
                break
            if not v.healthy or v.max_loras <= 0 or v.lora_served is None:
                continue
            want = {a: self.demand(v.name, a, now_s) for a in self.adapters_on(v.name) if a in v.lora_served}
            if len(want) <= v.max_loras:
                continue  # every adapter with demand here has a slot
            keep = set(sorted(want, key=lambda a: (-want[a], a))[: v.max_loras])  # the slots' rightful holders
            busy = v.lora_running | v.lora_waiting
            free = [a for a in want if a not in keep and a not in busy and not self.pinned(v.name, a, now_s)
                    and served.get(a, 0) > 1]
            if free:
                victim = min(free, key=lambda a: (want[a], a))
                out.append((v.name, victim))
                served[victim] -= 1
        return out
