"""The dev stack's port plan: every port a stack uses lies in one block of ``WIDTH`` ports
starting at its base port, and base ports are multiples of ``WIDTH``.

So any two stacks whose base ports differ use disjoint port sets. (The old plan spread
ports from base to base + 1110 (a simulator's replay socket defaulted to its KV-events
port + 1000), so two stacks 1000 apart collided.) Named slots come first, then three
ports per replica: HTTP, KV events, KV replay, for simulated and real vLLM replicas alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from random import randrange

from taskplane.dev.processes import port_in_use

#: Ports in one stack's block; base ports are multiples of it.
WIDTH = 100
#: Slots before the replicas' ports (room for parts added later, e.g. an Envoy data plane).
SLOTS = ("temporal", "temporal-ui", "postgres", "gateway", "envoy", "envoy-admin", "epp", "spare-7", "spare-8", "spare-9")
PER_REPLICA = 3
MAX_REPLICAS = (WIDTH - len(SLOTS)) // PER_REPLICA


class PortPlanError(ValueError):
    """A base port or replica count the plan cannot place."""


@dataclass(frozen=True, slots=True)
class ReplicaPorts:
    http: int
    kv_events: int
    kv_replay: int


@dataclass(frozen=True, slots=True)
class PortPlan:
    """The ports of one dev stack."""

    base: int
    replicas: int

    def slot(self, name: str) -> int:
        return self.base + SLOTS.index(name)

    def replica(self, i: int) -> ReplicaPorts:
        if not 0 <= i < self.replicas:
            raise IndexError(i)
        first = self.base + len(SLOTS) + PER_REPLICA * i
        return ReplicaPorts(first, first + 1, first + 2)

    def named(self) -> dict[str, int]:
        """Every port of the plan by part name (the ``_ports`` dict the stack records)."""
        out = {name: self.slot(name) for name in ("temporal", "temporal-ui", "postgres", "gateway")}
        for i in range(self.replicas):
            r = self.replica(i)
            out[f"replica-{i}"], out[f"replica-{i}-kv-events"], out[f"replica-{i}-kv-replay"] = r.http, r.kv_events, r.kv_replay
        return out

    def all_ports(self) -> range:
        """The whole block (reserved whether used or not)."""
        return range(self.base, self.base + WIDTH)


def plan(base: int, replicas: int) -> PortPlan:
    """The plan for a stack at ``base`` with ``replicas`` replicas, or ``PortPlanError``."""
    if base % WIDTH:
        lower = base - base % WIDTH
        raise PortPlanError(f"base port {base} is not a multiple of {WIDTH} (each stack takes a block of {WIDTH} ports): "
                            f"use {lower} or {lower + WIDTH}")
    if not 1024 <= base <= 65536 - WIDTH:
        raise PortPlanError(f"base port {base} is outside 1024..{65536 - WIDTH}")
    if not 1 <= replicas <= MAX_REPLICAS:
        raise PortPlanError(f"a dev stack runs 1 to {MAX_REPLICAS} replicas (got {replicas})")
    return PortPlan(base, replicas)


def free_base(replicas: int, *, low: int = 20_000, high: int = 31_000, tries: int = 50) -> int:
    """A random base port in [low, high) whose whole plan is free now (for tests that start
    stacks side by side; below the ephemeral range, see taskplane/ports.py)."""
    for _ in range(tries):
        base = randrange(low - low % WIDTH + WIDTH, high, WIDTH)
        if not any(port_in_use(p) for p in plan(base, replicas).named().values()):
            return base
    raise PortPlanError(f"no free block of {WIDTH} ports in {low}..{high}")
