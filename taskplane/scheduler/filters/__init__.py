"""Filters: drop candidate replicas that cannot (or should not) serve the call."""

from taskplane.scheduler.filters.adapter import AdapterServedFilter
from taskplane.scheduler.filters.balance import LoadBalanceFilter
from taskplane.scheduler.filters.basic import HealthyFilter, TenantGpuFilter
from taskplane.scheduler.filters.budget import LatencyBudgetFilter
from taskplane.scheduler.filters.memory import MemoryHeadroomFilter
from taskplane.scheduler.filters.prefill import PrefillFinishFilter
from taskplane.scheduler.filters.swap import SwapGateFilter

__all__ = ["AdapterServedFilter", "HealthyFilter", "LatencyBudgetFilter", "LoadBalanceFilter", "MemoryHeadroomFilter",
           "PrefillFinishFilter", "SwapGateFilter", "TenantGpuFilter"]
