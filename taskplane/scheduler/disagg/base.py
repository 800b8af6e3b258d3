"""What a disaggregation decider sees, and the plugin kind it is.

Prefill/decode disaggregation runs after the pipeline chose where a call decodes: the
decode replica is the normal pipeline's choice over the replicas that generate ("decode"
and "both" roles). A *decider* then says whether the prompt is computed on a prefill-role
replica instead, whose KV the decode replica pulls over the link (vLLM's NIXL connector),
and the prefill profile (filters, scorers, picker over the prefill-role replicas) says which.
This is llm-d's pd-profile-handler and Dynamo's disaggregated router, as one extension
point: the same step runs in the live picker and in the cluster simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskplane.scheduler.framework.plugin import Kind, Plugin
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.latency import LatencyModel
from taskplane.scheduler.types import CallRequest, ReplicaView


@dataclass(slots=True)
class PDCandidate:
    """One placed call as a decider judges it: its decode replica and the prefill pool."""

    request: CallRequest
    decode: ReplicaView  # the replica the pipeline chose to generate
    decode_uncached_tokens: float  # prompt tokens the decode replica does not hold (it would prefill them)
    decode_ttft_ms: float | None  # predicted TTFT there, prefilling locally (None: not predicted)
    prefill: CycleState  # the prefill-role replicas left after the prefill profile's filters
    latency: LatencyModel

    @property
    def prompt_hit(self) -> float:
        """Share of the prompt the decode replica holds already (0..1)."""
        p = max(self.request.prompt_tokens, 1)
        return max(0.0, 1.0 - self.decode_uncached_tokens / p)

    @property
    def prefill_waiting(self) -> float:
        """Requests waiting on the prefill replicas in play (Dynamo's prefill queue)."""
        return float(self.prefill.c(self.prefill.waiting).sum())


class Decider(Plugin):
    """Whether a placed call runs its prefill on a prefill-role replica.

    ``consider`` runs before the prefill profile scores anything (most calls stop there);
    ``confirm`` sees the chosen prefill replica (position ``pos`` of ``c.prefill``'s
    candidates) and may still keep the call local."""

    kind = Kind.DECIDER

    def consider(self, c: PDCandidate) -> bool:
        raise NotImplementedError

    def confirm(self, c: PDCandidate, pos: int) -> bool:
        return True
