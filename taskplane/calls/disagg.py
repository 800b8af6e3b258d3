"""The prefiller header of a disaggregated call, for both data planes.

When the scheduler's decision names a prefill replica (``Decision.prefill_replica``), the call
still goes to its decode replica, and the request carries ``x-prefiller-host-port``, the
prefill replica's ``host:port``: llm-d's prefill-header-handler names it the same way, and the
decode replica's sidecar (``taskplane pd-sidecar``, or llm-d's routing sidecar) runs the
prefill there first. A client never chooses it: the header a client sent is removed.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from taskplane.engines.registry import ReplicaRegistry
from taskplane.scheduler.types import Decision

PREFILLER_HEADER = "x-prefiller-host-port"


def prefiller_host_port(registry: ReplicaRegistry, decision: Decision) -> str | None:
    """``host:port`` of the decision's prefill replica; None when the call is not
    disaggregated (or the replica left the registry since the decision)."""
    name = decision.prefill_replica
    if name is None:
        return None
    state = registry.replicas.get(name)
    if state is None:
        return None
    return urlsplit(state.config.url).netloc or None
