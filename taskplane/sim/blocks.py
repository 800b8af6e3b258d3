"""How the simulator names a prompt's KV blocks: integer contents, then chained hashes.

Block ``j`` of a closed-loop task has a 63-bit *content* id (:func:`block_contents`);
its hash is what :func:`taskplane.scheduler.hashing.chain_hashes` gives a block of
``block_size`` tokens all equal to that content, chained on block ``j-1``. BlockStored
events carry those tokens, so the scheduler's KV index, which re-hashes event tokens,
meets the request's hashes.
"""

from __future__ import annotations

from taskplane.scheduler.hashing import ROOT
from taskplane.sim.tokens import repeated_block_hash
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
    parent = hashes[-1] if hashes else ROOT
    for c in contents[len(hashes):n_blocks]:
        parent = repeated_block_hash(parent, c, block_size)
        hashes.append(parent)
