"""Tenant settings the scheduling core needs, as plain data (built from ``TenantConfig``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from taskplane.scheduler.types import Priority


@dataclass(slots=True, frozen=True)
class TenantPolicy:
    id: str
    weight: float = 1.0  # fair-share weight inside a priority band
    max_priority: str = Priority.STANDARD.value  # highest band the tenant may ask for
    excluded_gpus: frozenset[str] = field(default_factory=frozenset)  # never placed on these


DEFAULT_TENANT = TenantPolicy("default")


def tenant_table(tenants: Iterable[Any] | None) -> dict[str, TenantPolicy]:
    """``TenantConfig`` objects (or anything with the same attributes) -> policies by id."""
    table: dict[str, TenantPolicy] = {}
    for t in tenants or ():
        if isinstance(t, TenantPolicy):
            table[t.id] = t
            continue
        table[t.id] = TenantPolicy(
            id=t.id,
            weight=float(getattr(t, "weight", 1.0)),
            max_priority=str(getattr(t, "max_priority", Priority.STANDARD.value)),
            excluded_gpus=frozenset(str(g) for g in getattr(t, "excluded_gpus", ()) or ()),
        )
    return table
