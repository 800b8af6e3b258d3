"""Scorers: a normalised score in [0, 1] per candidate replica, higher is better."""

from taskplane.scheduler.scorers.adapter import AdapterAffinityScorer
from taskplane.scheduler.scorers.cache import PrefixCacheScorer, WorkingSetScorer
from taskplane.scheduler.scorers.cost import DynamoCostScorer, GpuPriceScorer
from taskplane.scheduler.scorers.load import KvUsageScorer, LeastLoadedScorer, QueueScorer
from taskplane.scheduler.scorers.residency import AdapterResidencyScorer
from taskplane.scheduler.scorers.resources import (
    LatencyScorer,
    MemoryHeadroomScorer,
    WeightWarmthScorer,
)
from taskplane.scheduler.scorers.session import SessionAffinityScorer
from taskplane.scheduler.scorers.tiers import DynamoKvbmCostScorer, TieredPrefixScorer
from taskplane.scheduler.scorers.workflow import WorkflowContextScorer

__all__ = [
    "AdapterAffinityScorer",
    "AdapterResidencyScorer",
    "DynamoCostScorer",
    "DynamoKvbmCostScorer",
    "GpuPriceScorer",
    "KvUsageScorer",
    "LatencyScorer",
    "LeastLoadedScorer",
    "MemoryHeadroomScorer",
    "PrefixCacheScorer",
    "QueueScorer",
    "SessionAffinityScorer",
    "TieredPrefixScorer",
    "WeightWarmthScorer",
    "WorkflowContextScorer",
    "WorkingSetScorer",
]
