"""Flow control's settings as one flat record (the Python API the benches and tests use),
and the priority cap a tenant's calls are held to.

Each field is a parameter of one flow-control plugin (:data:`FIELDS` says which);
``plugin_specs`` turns the record into the plugins' specs and ``from_plugins`` reads it
back, so a YAML ``scheduler.flow_control`` list and this record configure the same thing."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from taskplane.scheduler.types import Priority

band_rank = Priority.rank_of  # 0 for critical ... 3 for batch; unknown names count as standard


def check_priority_cap(requested: str, max_priority: str) -> bool:
    """True when a tenant capped at ``max_priority`` may ask for ``requested``.

    The gateway answers 403 ``forbidden`` when this is False.
    """
    return band_rank(requested) >= band_rank(max_priority)


@dataclass(slots=True)
class AdmissionSettings:
    """How admission control behaves (defaults suit an agent fleet)."""

    max_waiting_per_replica: int = 2  # a replica with this many engine-queued calls is saturated
    max_queue: int = 4096  # calls held per pool; beyond it the least valuable call is shed
    shed_bands: tuple[str, ...] = ("interactive", "standard", "batch")  # critical is never shed
    fair_unit: str = "tokens"  # fair share counts "tokens" (prompt + max_tokens) or "calls"
    min_retry_after_s: float = 1.0
    max_retry_after_s: float = 60.0
    # KV working-set admission: a task's first call is admitted on a replica only while the
    # contexts of the sessions pinned there, plus this call's, fit in this fraction of its
    # KV cache (per priority band; a band not listed is never held back). Without it, new
    # tasks evict the contexts of tasks paused on a tool call, every later step re-prefills
    # its whole context and throughput collapses under overload. Empty: off.
    # The shares leave room for contexts growing step by step and for the blocks of calls
    # running; lower bands give way first (see docs/benchmarks.md for the sweep that chose them).
    working_set_limits: dict[str, float] = field(
        default_factory=lambda: {"interactive": 0.8, "standard": 0.75, "batch": 0.7}
    )
    working_set_retry_after_s: float = 30.0  # Retry-After of a task's first call refused for room
    # A task's first call that finds no room is held in the queue this long (room frees when
    # a task ends or a paused session's pin expires) and refused only if it is still
    # without room then: a refusal costs the client a Retry-After, so only a fleet that
    # cannot serve it in time refuses. 0: refuse at once.
    working_set_hold_s: float = 30.0
    # A task whose deadline budget is shorter than this many Retry-Afters is never refused
    # for room: the wait alone would likely cost it its deadline, so it is admitted and
    # takes its chance with the engine's LRU (found on real vLLM with tasks due in 15-45 s,
    # where every refusal became a missed deadline). Tasks without a budget can wait. At 2
    # (60 s) the simulated agents (deadlines 120-900 s) are refused exactly as before.
    working_set_min_budget_retries: float = 2.0
    # With a host (CPU) KV tier a session parked there during a tool gap is not lost: it
    # comes back at PCIe speed instead of being recomputed. Working-set room can count a
    # replica's host-tier blocks at this share of a GPU block (what a reload saves against
    # a recompute is ~0.9: 3.3 us against 33 us per token of an 8B model on an H100). It is
    # 0 (GPU room only) because counting the host tier measured worse: on the agent mix at
    # 1.3x with 256 GB of host per replica, tasks within deadline fell from 88.7 % (0) to
    # 79.9 % (0.1) and 83.3 % (0.3, 0.9): the room rule also caps the sessions competing
    # for a replica's compute; relaxed, TTFT p50 rose 58 -> 98-165 ms and prefix hits fell
    # 92.7 % -> 81-83 % (docs/benchmarks.md). No effect on a replica without a host tier.
    working_set_host_share: float = 0.0
    # Late binding: a call is not dispatched to a replica whose queued prefill work (the
    # prefill ms already committed to it, by the scheduler's latency model) exceeds this;
    # while every eligible replica is past it the call waits in the admission queue and goes
    # to the first replica that drains below (flowcontrol/backlog.py). Committing a call
    # early to a deep queue adds to the TTFT tail. 1000 ms keeps the simulator's fingerprints
    # (300 ms too) and costs Mooncake least; 300 ms measured better on the agent mix, worse on
    # Mooncake. None: off (any unsaturated replica, as before).
    max_prefill_backlog_ms: float | None = 1000.0
    # One prefill at a time on a session's replica: a call that stays with its pinned
    # replica is held while that replica has prompt tokens in flight (dispatched, not yet
    # prefilled) and dispatched when they are done, first come first served
    # (flowcontrol/gate.py). Two prompts admitted into one engine step both get their first
    # token when the step ends; held, the first is as fast as alone and the second ends its
    # prefill about when it would have. False: off (a pinned call is dispatched at once).
    serial_prefill: bool = True
    # ... in pools of at least this many replicas. On the 4-replica agent mix at 1.3x load,
    # where admission already holds new tasks for room and late binding for backlog, the gate
    # measured worse (tasks within deadline 92.9 % -> 90.0 % on seed 2, tool-gap / warm p99
    # 1.43x -> 2.13x on seed 1), so smaller pools
    # (the agent benches, the live 3-replica dev stack) keep their placements and timings.
    serial_prefill_min_replicas: int = 8
    # ... and a call is held at most this long: a replica whose in-flight prefill never
    # clears (a hung engine, a lost first token) must not hold its line for ever; past it
    # the call is dispatched as without the gate.
    serial_prefill_max_hold_ms: float = 2000.0
    # ... and only a call with at least this many prompt tokens to compute (its prompt less
    # the blocks the replica holds). A hold spares the prefill in flight the held call's
    # prefill, and costs the held call one turn of the control loop: the gateway hears that
    # the prefill in flight has started (the replica's KV events) or ended (a first token),
    # answers the held call, and the data plane sends it on. In the simulator that turn is
    # free; live it took 5-10 ms here, more than a 128-token prefill (~4 ms on an H100)
    # could spare, so such short calls go at once: with no floor, a live burst of 200
    # short calls on 8 replicas waited 1.5 s on average in the gate's lines
    # (docs/benchmarks.md). 128 keeps the simulator's figures within their noise (Mooncake
    # p50 the same; the 16-replica agent mix at 1.3x 86.8 % of tasks in deadline against
    # 87.2 % with no floor, 3 seeds; 768 cost 2.3 points there). A count of tokens, not the
    # latency model's prediction: live, a prediction calibrated on a slow first call held
    # 70-token calls.
    serial_prefill_min_tokens: int = 128
    # Holds must pay (flowcontrol/holdcost.py): working-set room and late binding hold a
    # call only while its expected wait is below the slowdown its admission would cause the
    # others, and never longer. False: the fixed holds above, whatever they cost.
    hold_pays: bool = False  # opt-in: on by default it cost the 1.3x agent mix (docs/benchmarks/flowcontrol.md)
    # A task's first call is not held for working-set room while some replica that can take
    # it has no engine-queued call and at most this much queued prefill (ms). None: off.
    working_set_short_queue_ms: float | None = None  # opt-in (500 ms was measured)

    def retry_after(self, wait_s: float) -> float:
        return float(min(max(math.ceil(wait_s), self.min_retry_after_s), self.max_retry_after_s))

    def plugin_specs(self) -> list[dict[str, Any]]:
        """The flow-control plugins these settings configure, as registry specs."""
        params: dict[str, dict[str, Any]] = {t: {} for t in PLUGIN_TYPES}
        for name, (type_name, key) in FIELDS.items():
            value = getattr(self, name)
            params[type_name][key] = value
        params["prefill-backlog"]["pays"] = self.hold_pays
        return [{"type": t, "params": params[t]} for t in PLUGIN_TYPES]

    @classmethod
    def from_plugins(cls, plugins: Iterable[Any]) -> AdmissionSettings:
        """The flat record of built flow-control plugins (``type_name`` and ``params``)."""
        out = cls()
        by_type = {p.type_name: p for p in plugins}
        for name, (type_name, key) in FIELDS.items():
            plugin = by_type.get(type_name)
            if plugin is not None:
                value = getattr(plugin.params, key)
                setattr(out, name, tuple(value) if name == "shed_bands" else value)
        return out


#: the flow-control plugin types, in the order flow control applies them
PLUGIN_TYPES = ("priority-edf", "weighted-fair-share", "shed", "working-set-room", "prefill-backlog", "prefill-gate")

#: each ``AdmissionSettings`` field: (plugin type, parameter)
FIELDS: dict[str, tuple[str, str]] = {
    "max_waiting_per_replica": ("shed", "max_waiting_per_replica"),
    "max_queue": ("shed", "max_queue"),
    "shed_bands": ("shed", "shed_bands"),
    "min_retry_after_s": ("shed", "min_retry_after_s"),
    "max_retry_after_s": ("shed", "max_retry_after_s"),
    "fair_unit": ("weighted-fair-share", "fair_unit"),
    "working_set_limits": ("working-set-room", "limits"),
    "working_set_retry_after_s": ("working-set-room", "retry_after_s"),
    "working_set_hold_s": ("working-set-room", "hold_s"),
    "working_set_min_budget_retries": ("working-set-room", "min_budget_retries"),
    "working_set_host_share": ("working-set-room", "host_share"),
    "working_set_short_queue_ms": ("working-set-room", "short_queue_ms"),
    "hold_pays": ("working-set-room", "pays"),
    "max_prefill_backlog_ms": ("prefill-backlog", "max_prefill_backlog_ms"),
    "serial_prefill": ("prefill-gate", "enabled"),
    "serial_prefill_min_replicas": ("prefill-gate", "min_replicas"),
    "serial_prefill_max_hold_ms": ("prefill-gate", "max_hold_ms"),
    "serial_prefill_min_tokens": ("prefill-gate", "min_tokens"),
}
