"""The flow-control extension point: a plugin per job (ordering, fairness, shedding,
working-set room, late binding, the prefill gate), registered in the scheduler's plugin
registry under :attr:`Kind.FLOW` with documented ``param()`` settings, as filters and
scorers are. Flow control finds each by its ``role``; a role not configured is off
(ordering and fairness fall back to their defaults).
"""

from __future__ import annotations

from typing import Any, ClassVar

from taskplane.scheduler.framework.plugin import Kind, Plugin

ROLES = ("ordering", "fairness", "shedding", "room", "backlog", "gate")


class FlowPlugin(Plugin):
    """A flow-control plugin: one job, one ``role`` among :data:`ROLES`."""

    kind = Kind.FLOW
    role: ClassVar[str] = ""

    def __init__(self, params: Any, **kw: Any) -> None:
        super().__init__(params, **kw)
