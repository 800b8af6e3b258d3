"""The infinite-cache ceiling: the prefix-hit ratio no router can beat on a workload.

Picture one replica with an unbounded prefix cache that sees every call in arrival order:
a call hits the leading blocks of its prompt that any earlier call already computed
(its prompt, and for a closed-loop agent also its generated output), with vLLM's
accounting — full blocks only, and at most ``(prompt - 1) // block_size`` blocks, since
the last prompt token is always recomputed. The ratio is token-weighted (hit tokens over
prompt tokens), like ``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total``
and the reports' cache-hit ratio, so a policy's ratio divided by this ceiling says how
much of the reusable context it actually reused.

Block identity follows the cluster simulator (:mod:`taskplane.sim.cluster`): a
closed-loop task's block ``j`` holds its agent's shared system prompt while the whole
block lies inside it, else the task's own content; an open-loop call lists its block
contents. Blocks are chained (equal block, different predecessors: different block).
``tests/bench`` checks the figure against the simulator with one huge replica.

The real-engine bench (``--engine vllm``) counts the same way over the prompts it sends
(:func:`prompt_hit_ceiling`): blocks of 128 bytes, chained by a running SHA-256, so one
accounting (:func:`leading_hits`) serves both, and the LRU bound beside them.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Container, Hashable, Iterable, Sequence

from taskplane.sim.cluster import block_contents, mix
from taskplane.sim.workloads.base import Workload


def _chain(parent: int, content: int) -> int:
    return mix(parent ^ 0x5BD1E995, content)


def _chained(contents: Iterable[int]) -> list[int]:
    """Block ids of a prompt whose blocks hold ``contents``, each chained to its predecessors."""
    ids = []
    parent = 0
    for content in contents:
        parent = _chain(parent, content)
        ids.append(parent)
    return ids


def leading_hits(blocks: Sequence[Hashable], prompt_tokens: int, block_size: int, cache: Container[Hashable]) -> int:
    """Hit tokens of one call as vLLM counts them: the leading blocks of its prompt that
    ``cache`` holds, full blocks only and at most ``(prompt - 1) // block_size`` of them
    (the prompt's last token is always computed)."""
    cap = min(len(blocks), (prompt_tokens - 1) // block_size)
    k = 0
    while k < cap and blocks[k] in cache:
        k += 1
    return k * block_size


def hit_ceiling(workload: Workload) -> float:
    """Token-weighted prefix-hit ratio of an infinite cache over the whole workload."""
    hits, prompts = ceiling_tokens(workload)
    return hits / prompts if prompts else 0.0


def ceiling_tokens(workload: Workload) -> tuple[int, int]:
    """(hit tokens, prompt tokens) of an infinite cache, calls taken in arrival order."""
    bs = workload.block_size
    seen: set[int] = set()
    hit_tokens = 0
    prompt_tokens = 0
    # open-loop calls are sorted by arrival; closed-loop tasks share only their agent's
    # system prompt with each other, so taking each task whole, in arrival order, gives
    # the same counts as any interleaving
    open_calls: list[tuple[float, int, list[int], int]] = []
    order = 0
    for spec in sorted(workload.tasks, key=lambda t: t.arrival_s):
        if not spec.calls:
            continue
        if spec.open_loop:
            for c in spec.calls:
                contents = list(c.contents or [])
                prompt = c.prompt_tokens or len(contents) * bs
                open_calls.append((c.at_s if c.at_s is not None else spec.arrival_s, order,
                                   contents[: prompt // bs], prompt))
                order += 1
            continue
        ids: list[int] = []
        parent = 0
        ctx = spec.prefix_tokens
        for call in spec.calls:
            ctx += call.append_tokens
            prompt = ctx
            out = max(1, call.output_tokens)
            n_total = (prompt + out) // bs
            for content in block_contents(spec, len(ids), n_total, bs):
                parent = _chain(parent, content)
                ids.append(parent)
            hit_tokens += leading_hits(ids, prompt, bs, seen)
            prompt_tokens += prompt
            seen.update(ids[:n_total])
            ctx += out
    for _, hit, prompt in _open_hits(open_calls, bs, seen):
        hit_tokens += hit
        prompt_tokens += prompt
    return hit_tokens, prompt_tokens


def _open_hits(open_calls: list[tuple[float, int, list[int], int]], bs: int,
               seen: set[int]) -> Iterable[tuple[int, int, int]]:
    """(order, hit tokens, prompt tokens) of open-loop calls in arrival order, each adding
    its blocks to ``seen``."""
    open_calls.sort(key=lambda x: (x[0], x[1]))
    for _, order, contents, prompt in open_calls:
        ids = _chained(contents)
        yield order, leading_hits(ids, prompt, bs, seen), prompt
        seen.update(ids)


def open_call_hits(workload: Workload) -> dict[tuple[str, int], tuple[int, int]]:
    """Per open-loop call ``(task_id, call index)``: (hit tokens, prompt tokens) of the
    infinite cache (the ceiling's accounting, call by call; trace workloads)."""
    bs = workload.block_size
    keys: list[tuple[str, int]] = []
    open_calls: list[tuple[float, int, list[int], int]] = []
    for spec in sorted(workload.tasks, key=lambda t: t.arrival_s):  # ties as ceiling_tokens breaks them
        if not spec.open_loop:
            continue
        for k, c in enumerate(spec.calls):
            contents = list(c.contents or [])
            prompt = c.prompt_tokens or len(contents) * bs
            open_calls.append((c.at_s if c.at_s is not None else spec.arrival_s, len(keys),
                               contents[: prompt // bs], prompt))
            keys.append((spec.task_id, k))
    return {keys[order]: (hit, prompt) for order, hit, prompt in _open_hits(open_calls, bs, set())}


def prompt_hit_ceiling(prompts: Iterable[bytes], block_size: int) -> float:
    """The infinite-cache ceiling over real prompts (tokens are bytes), in the order given:
    each full block identified by a SHA-256 over the prompt up to its end."""
    seen: set[bytes] = set()
    hits = queries = 0
    for tokens in prompts:
        h = hashlib.sha256()
        chain: list[bytes] = []
        for b in range(len(tokens) // block_size):
            h.update(tokens[b * block_size:(b + 1) * block_size])
            chain.append(h.copy().digest())
        hits += leading_hits(chain, len(tokens), block_size, seen)
        queries += len(tokens)
        seen.update(chain)
    return hits / queries if queries else 0.0


def lru_bound(workload: Workload, capacity_blocks: int) -> float | None:
    """Hit ratio of *one* LRU prefix cache holding ``capacity_blocks`` blocks (the whole
    fleet's KV memory pooled), calls in arrival order; open-loop (trace) workloads only.

    No router can do much better on a fleet of that total KV memory whose engines evict by
    LRU: it is the reference for "how much of the ceiling could this fleet reach at all".
    (Closed-loop agent calls have no fixed order, so they get None.)"""
    if any(not t.open_loop for t in workload.tasks if t.calls):
        return None
    bs = workload.block_size
    calls = sorted(((c.at_s or t.arrival_s, k, c) for t in workload.tasks for k, c in enumerate(t.calls)),
                   key=lambda x: (x[0], x[1]))
    lru: OrderedDict[int, None] = OrderedDict()
    hit = total = 0
    for _, _, c in calls:
        contents = list(c.contents or [])
        prompt = c.prompt_tokens or len(contents) * bs
        ids = _chained(contents[: prompt // bs])
        hit += leading_hits(ids, prompt, bs, lru)
        total += prompt
        for h in ids:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
    return hit / total if total else 0.0
