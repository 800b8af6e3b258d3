"""The admission queues of flow control, by pool, and their depth gauges.

Each pool (model) has a queue of calls held for capacity and, apart, a queue of new tasks
held for working-set room, so those never block the line of the rest. A queue's order is
what the ``ordering`` and ``fairness`` plugins give.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from taskplane.scheduler.flowcontrol.flowset import FlowSet
from taskplane.scheduler.flowcontrol.ordering import make_queue
from taskplane.scheduler.flowcontrol.queue import AdmissionQueue
from taskplane.scheduler.metrics import QUEUE_DEPTH


class PoolQueues:
    """The queues of one flow control, created on first use."""

    def __init__(self, name: str, flow: FlowSet | None, tenant_weight: Callable[[str], float], *,
                 metrics: bool) -> None:
        self.name = name
        self.flow = flow
        self.metrics = metrics
        self._tenant_weight = tenant_weight
        self.capacity: dict[str, AdmissionQueue] = {}
        self.room: dict[str, AdmissionQueue] = {}
        self._depth_gauges: dict[str, dict[str, Any]] = {}

    def for_capacity(self, model: str) -> AdmissionQueue:
        """The queue of ``model``'s calls held for capacity."""
        q = self.capacity.get(model)
        if q is None:
            q = self.capacity[model] = self._new_queue(model)
        return q

    def for_room(self, model: str) -> AdmissionQueue:
        """The queue of ``model``'s new tasks held for working-set room."""
        q = self.room.get(model)
        if q is None:
            q = self.room[model] = self._new_queue(f"{model}#room")
        return q

    def _new_queue(self, pool: str) -> AdmissionQueue:
        flow = self.flow
        return make_queue(pool, flow.ordering if flow else None, flow.fairness if flow else None, self._tenant_weight)

    def all(self) -> list[tuple[str, AdmissionQueue]]:
        """(model, queue) for every queue, the capacity queues first."""
        return [*self.capacity.items(), *self.room.items()]

    def held(self) -> int:
        return sum(len(q) for _, q in self.all())

    def update_depth(self, queue: AdmissionQueue) -> None:
        if self.metrics:
            gauges = self._depth_gauges.get(queue.pool)
            if gauges is None:
                gauges = self._depth_gauges[queue.pool] = {
                    band: QUEUE_DEPTH.labels(self.name, queue.pool, band) for band in queue.depths()
                }
            for band, depth in queue.depths().items():
                gauges[band].set(depth)

    def depths(self) -> dict[str, dict[str, int]]:
        """Held calls per model and priority band (both queues of a model summed)."""
        out: dict[str, dict[str, int]] = {}
        for model, q in self.all():
            depths = out.setdefault(model, {})
            for band, n in q.depths().items():
                depths[band] = depths.get(band, 0) + n
        return out
