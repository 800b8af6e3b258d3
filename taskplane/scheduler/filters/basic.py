"""Hard filters: health and the tenant's excluded GPU generations."""

from __future__ import annotations

import numpy as np

from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Filter
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState


@register("healthy")
class HealthyFilter(Filter):
    """Drops replicas that failed their health check (or are draining)."""

    def filter(self, state: CycleState) -> np.ndarray | None:
        return state.c(state.healthy)

    def keeps(self, one: OneCandidate) -> bool:
        return one.healthy


@register("tenant-gpu")
class TenantGpuFilter(Filter):
    """Drops GPU generations the call's tenant excludes (``tenants[].excluded_gpus``)."""

    def filter(self, state: CycleState) -> np.ndarray | None:
        tenant = state.handle.tenants.get(state.request.tenant)
        if tenant is None or not tenant.excluded_gpus:
            return None
        codes = [c for c in (state.table.gpu_code(g) for g in tenant.excluded_gpus) if c is not None]
        if not codes:
            return None
        return ~np.isin(state.c(state.gpu_codes), codes)

    def keeps(self, one: OneCandidate) -> bool:
        tenant = one.handle.tenants.get(one.request.tenant)
        return tenant is None or one.view.gpu not in tenant.excluded_gpus
