"""Prefill/decode disaggregation in the cluster simulator: the prefill leg, the KV link.

A call the policy disaggregates (``Decision.prefill_replica`` set) first runs on its
prefill replica as a one-token request (llm-d sends the prefiller ``max_tokens: 1``): it
computes the prompt's blocks that replica does not hold, reusing its own prefix cache.
Its KV then moves to the decode replica over a NIXL-like link (a per-transfer setup
latency plus bytes over bandwidth, bytes per token from the model profile), for the
blocks the decode replica lacks; the blocks land in the decode replica's cache (cached,
unreferenced, most recently used: where vLLM's NixlConnector leaves them, with their
BlockStored events) and the call is submitted there, finding its prompt cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from taskplane.sim.gpus import model_profile
from taskplane.sim.requests import SimRequest

if TYPE_CHECKING:
    from taskplane.sim.calls import SimCall
    from taskplane.sim.engine import SimEngine


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """The prefill-to-decode KV link (one per pair, uncontended)."""

    setup_ms: float = 1.5  # per transfer: NIXL descriptor exchange and the RDMA handshake
    gb_per_s: float = 25.0  # RDMA bandwidth (200 Gb/s NIC)

    def transfer_s(self, tokens: int, model: str) -> float:
        """Seconds to move ``tokens`` tokens of ``model``'s KV (0 tokens: nothing moves)."""
        if tokens <= 0:
            return 0.0
        return self.setup_ms / 1000.0 + tokens * model_profile(model).kv_bytes_per_token / (self.gb_per_s * 1e9)


@dataclass(slots=True, eq=False)
class PrefillLeg:
    """The prefill half of a disaggregated call (the engine's tag of the one-token request)."""

    call: SimCall
    decode: int  # the decode replica's index
    prefill: int  # the prefill replica's index


def prefill_request(req: SimRequest, leg: PrefillLeg) -> SimRequest:
    """The prefill replica's request: the same prompt, one token out, no output blocks."""
    return SimRequest(req_id=f"{req.req_id}/prefill", prompt_tokens=req.prompt_tokens, output_tokens=1,
                      block_hashes=req.block_hashes, token_ids=req.token_ids, tag=leg, adapter=req.adapter)


def missing_blocks(engine: SimEngine, hashes: list[int]) -> int:
    """How many leading prompt blocks past the decode replica's cached prefix it lacks."""
    return len(hashes) - engine.kv.match(hashes, len(hashes))


def receive_kv(engine: SimEngine, req: SimRequest, now: float) -> int:
    """Store the prompt's blocks in ``engine``'s cache as a finished KV pull leaves them;
    returns the blocks stored (0 when they do not fit without evicting referenced ones:
    the decode replica then recomputes, as vLLM does when a pull fails)."""
    b = engine.batcher
    b.run_until(now, strict=True)
    kv = engine.kv
    hashes = list(req.block_hashes)
    hits = kv.match(hashes, len(hashes))
    n = len(hashes) - hits
    if n <= 0 or not kv.can_allocate(hashes, hits, n):
        return 0
    hold = kv.acquire(hashes[:hits])
    kv.allocate(n)
    stored = kv.store(hashes, hits, hits + n, req.token_ids, hold)
    kv.release(hold, n - stored)
    b.flush_kv(now)
    return n
