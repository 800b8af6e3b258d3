"""Autoscalers by name (the bench's ``--autoscalers`` and ``dev up --autoscale``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from taskplane.autoscale.baselines import AibrixKpa, DynamoPlanner, FixedPeak, HpaQueue
from taskplane.autoscale.planner import TaskplaneAutoscaler
from taskplane.autoscale.types import Plan, PoolSignals


class Autoscaler(Protocol):
    name: str

    def plan(self, signals: PoolSignals) -> Plan: ...


AUTOSCALERS: dict[str, Callable[[], Autoscaler]] = {
    "fixed-peak": FixedPeak,
    "hpa-queue": HpaQueue,
    "dynamo-planner": DynamoPlanner,
    "aibrix-kpa": AibrixKpa,
    "taskplane": TaskplaneAutoscaler,
}


def autoscaler_names() -> list[str]:
    return list(AUTOSCALERS)


def build_autoscaler(name: str) -> Autoscaler:
    """A fresh autoscaler (they keep windows: one per run)."""
    try:
        return AUTOSCALERS[name]()
    except KeyError:
        raise ValueError(f"unknown autoscaler {name!r}; choose from {', '.join(AUTOSCALERS)}") from None


def parse_range(spec: str) -> tuple[int, int]:
    """``"MIN:MAX"`` (``dev up --autoscale``) -> (min, max), validated."""
    lo, sep, hi = spec.partition(":")
    try:
        mn, mx = int(lo), int(hi if sep else lo)
    except ValueError:
        raise ValueError(f"--autoscale takes MIN:MAX like 1:4, got {spec!r}") from None
    if mn < 0 or mx < 1 or mn > mx:
        raise ValueError(f"--autoscale MIN:MAX needs 0 <= MIN <= MAX and MAX >= 1, got {spec!r}")
    return mn, mx
