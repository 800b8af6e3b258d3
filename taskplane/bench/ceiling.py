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
"""

from __future__ import annotations

from collections import OrderedDict

from taskplane.sim.cluster import block_contents, mix
from taskplane.sim.workloads.base import Workload


def _chain(parent: int, content: int) -> int:
    return mix(parent ^ 0x5BD1E995, content)


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

    def serve(ids: list[int], prompt: int, n_prompt: int) -> None:
        nonlocal hit_tokens, prompt_tokens
        cap = min(n_prompt, (prompt - 1) // bs)
        k = 0
        while k < cap and ids[k] in seen:
            k += 1
        hit_tokens += k * bs
        prompt_tokens += prompt

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
            serve(ids, prompt, prompt // bs)
            seen.update(ids[:n_total])
            ctx += out
    open_calls.sort(key=lambda x: (x[0], x[1]))
    for _, _, contents, prompt in open_calls:
        ids = []
        parent = 0
        for content in contents:
            parent = _chain(parent, content)
            ids.append(parent)
        serve(ids, prompt, len(ids))
        seen.update(ids)
    return hit_tokens, prompt_tokens


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
        ids: list[int] = []
        parent = 0
        for content in contents[: prompt // bs]:
            parent = _chain(parent, content)
            ids.append(parent)
        cap = min(len(ids), (prompt - 1) // bs)
        k = 0
        while k < cap and ids[k] in lru:
            k += 1
        hit += k * bs
        total += prompt
        for h in ids:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
    return hit / total if total else 0.0
