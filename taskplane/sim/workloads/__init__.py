"""Workloads for the cluster simulator: agent tasks and trace replays (Mooncake format)."""

from taskplane.sim.workloads.base import CallSpec, TaskSpec, Workload

__all__ = ["CallSpec", "TaskSpec", "Workload"]
