"""A release pass's own placements, reflected in its private copy of the replica table
(the caller's views count a call only once it is dispatched)."""

from __future__ import annotations

import math

from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.types import CallRequest, Decision, ReplicaView


def account_placed(table: ReplicaTable, req: CallRequest, decision: Decision) -> None:
    """``account`` for a placement made without a pool state (a call the gate handed out):
    the call's uncached prompt and new blocks from the decision's cached blocks."""
    name = decision.replica
    r = table.get(name or "")
    if name is None or r is None:
        return
    cached = decision.cached_blocks * req.block_size
    blocks = math.ceil((req.prompt_tokens + req.max_tokens) / max(req.block_size, 1)) - decision.cached_blocks
    _reflect(table, name, r, req, new_blocks=max(blocks, 0), uncached_tokens=max(req.prompt_tokens - cached, 0))


def account(table: ReplicaTable, state: CycleState, decision: Decision) -> None:
    """Reflect a placement in a release pass's private copy of the table."""
    name = decision.replica
    if name is None:
        return
    j = state.position_of(name)
    _reflect(table, name, state.view(j), state.request, new_blocks=int(state.new_blocks_needed()[j]),
             uncached_tokens=int(state.uncached_tokens()[j]))


def _reflect(
    table: ReplicaTable, name: str, r: ReplicaView, req: CallRequest, *, new_blocks: int, uncached_tokens: int
) -> None:
    """``name`` (as ``r`` saw it) has one more call waiting: its new blocks taken, its prompt and decode in flight."""
    table.update(
        name,
        num_waiting=r.num_waiting + 1,
        kv_blocks_free=max(r.kv_blocks_free - new_blocks, 0),
        inflight_prefill_tokens=r.inflight_prefill_tokens + uncached_tokens,
        inflight_decode_tokens=r.inflight_decode_tokens + req.max_tokens,
    )
