"""Adapter served: a call with a LoRA adapter goes only where that adapter is registered.

vLLM serves an adapter as a model of its name only on servers that registered it
(``--lora-modules`` at start, ``POST /v1/load_lora_adapter`` at run time), and answers 404
elsewhere. A replica's registered adapters are the models its ``/v1/models`` lists with the
base model as parent (``ReplicaView.lora_served``). A replica that reports none of this
(``None``) is kept: it may serve the adapter. When no candidate serves it, nothing is
dropped: the replica's own 404 then names the adapter, which says more than a 503 would.
Calls without an adapter are never narrowed.
"""

from __future__ import annotations

import numpy as np

from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.plugin import Filter
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.types import ReplicaView


def serves(view: ReplicaView, adapter: str) -> bool:
    """Whether ``view``'s replica may serve ``adapter`` (registered there, or not known)."""
    return view.lora_served is None or adapter in view.lora_served


@register("adapter-served")
class AdapterServedFilter(Filter):
    """Keeps, for a call with an adapter, the replicas where that adapter is registered."""

    def filter(self, state: CycleState) -> np.ndarray | None:
        adapter = state.request.adapter
        if not adapter:
            return None
        keep = np.fromiter((serves(state.view(int(i)), adapter) for i in state.sel), dtype=bool,
                           count=len(state.sel))
        if keep.all() or not keep.any():
            return None
        return keep

    def keeps(self, one: OneCandidate) -> bool:
        adapter = one.request.adapter
        return not adapter or serves(one.view, adapter)
