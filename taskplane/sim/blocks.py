"""How the simulator names a prompt's KV blocks: integer contents, then chained hashes.

Block ``j`` of a closed-loop task has a 63-bit *content* id (:func:`block_contents`);
its hash is what :func:`taskplane.scheduler.hashing.chain_hashes` gives a block of
``block_size`` tokens all equal to that content, chained on block ``j-1``. BlockStored
events carry those tokens, so the scheduler's KV index, which re-hashes event tokens,
meets the request's hashes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from taskplane.scheduler.hashing import adapter_root
from taskplane.scheduler.kv.events import BlockStored
from taskplane.sim.lora import Adapter
from taskplane.sim.tokens import RepeatedBlocks, repeated_block_hash
from taskplane.sim.workloads.base import TaskSpec

_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1


def mix(a: int, b: int) -> int:
    """A 63-bit content id from two ints (splitmix64 finaliser)."""
    z = (a * 0x9E3779B97F4A7C15 + b + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & _MASK63


def block_contents(spec: TaskSpec, start: int, stop: int, block_size: int) -> list[int]:
    """The content ids of blocks ``start..stop-1`` of a closed-loop task: the agent's shared
    system prompt while it lasts (its whole blocks), then the task's own tokens; each block
    is its id repeated. One rule for the simulator and the hit-ceiling model."""
    n_prefix = spec.prefix_tokens // block_size
    key, seed = spec.prefix_key, spec.seed
    return [mix(key if j < n_prefix else seed, j) for j in range(start, stop)]


def extend_hashes(spec: TaskSpec, contents: list[int], hashes: list[int], n_blocks: int, block_size: int) -> None:
    """Name blocks ``len(hashes)..n_blocks-1`` in place: their contents (kept when given),
    then their chained hashes (``repeated_block_hash``: memoised, shared with the KV index)."""
    if len(contents) < n_blocks:
        contents.extend(block_contents(spec, len(contents), n_blocks, block_size))
    parent = hashes[-1] if hashes else adapter_root(spec.adapter)
    for c in contents[len(hashes):n_blocks]:
        parent = repeated_block_hash(parent, c, block_size)
        hashes.append(parent)


def stored_event(hashes: Sequence[int], first: int, run: list[int], token_ids: Sequence[int] | None, offset: int,
                 parent: int | None, block_size: int, lora: Adapter | None = None) -> BlockStored:
    """vLLM's BlockStored for ``run``, the blocks ``first..`` of ``hashes`` just cached:
    their tokens (``token_ids`` of the whole request, ``hashes[0]`` being its block
    ``offset``) and the hash before them (``parent`` when ``first`` is 0)."""
    toks: Any = []
    if token_ids is not None:
        a = (offset + first) * block_size
        toks = token_ids[a : a + len(run) * block_size]
        # a list or array slice is a copy already; the simulator's lazy RepeatedBlocks is
        # passed through (the index hashes it block by block, without 256 ints a block)
        if not isinstance(toks, list | np.ndarray | RepeatedBlocks):
            toks = list(toks)
    return BlockStored(block_hashes=run, parent_block_hash=hashes[first - 1] if first > 0 else parent,
                       token_ids=toks, block_size=block_size, lora_id=lora.int_id if lora else None,
                       lora_name=lora.name if lora else None)
