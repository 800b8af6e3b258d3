"""A seeded generator of traces in the Mooncake format, with a tool-agent shape.

Only Mooncake's conversation trace is on this machine (no internet), and a win should
hold on a second trace in the same format. Mooncake's release also has a
"toolagent" trace whose shape differs from the conversations: long prompts that share a
large tool-description prefix per agent, multi-turn episodes whose every turn appends a
tool result, short outputs (tool calls) and arrivals in bursts. This module writes such a
trace, deterministic for a seed, so ``taskplane bench --workload mooncake --trace FILE``
replays it exactly like the real one:

    {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}

with one hash id per 512-token block, chained (equal leading ids = equal prefix), and
``len(hash_ids) == ceil(input_length / 512)`` on every line, as in the real trace. Each
line also names its episode (``"session_id": "ep-N"``, a key the real trace lacks and other
readers ignore): the episodes of one agent share its tool prefix, so deriving sessions from
shared prefixes, as the replay does for the real trace, would merge them into one. The
numbers below are assumptions of a plausible tool-agent fleet, not measurements.

    python -m taskplane.bench.tracegen --out toolagent.jsonl --seed 1
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BLOCK = 512  # tokens per hash id (the Mooncake trace format)


@dataclass(frozen=True, slots=True)
class ToolAgentShape:
    """The trace's shape; every field's default is an assumption, documented."""

    duration_s: float = 600.0  # arrivals of new episodes within this window (turns run on past it)
    episodes_per_s: float = 1.5  # mean rate of new episodes (bursty, see below)
    burst_period_s: float = 120.0  # the rate alternates high / low every half period ...
    burst_factor: float = 3.0  # ... high = factor x low (mean kept at episodes_per_s)
    agents: int = 12  # distinct agents, each with its own tool-description prefix
    agent_zipf: float = 1.1  # popularity of the agents (Zipf exponent)
    prefix_blocks: tuple[int, int] = (8, 28)  # tool-description prefix: 4k-14k tokens, per agent
    system_blocks: int = 1  # one system prompt block shared by every request (as in Mooncake)
    turns: tuple[int, int] = (4, 16)  # turns per episode (uniform)
    task_tokens: tuple[int, int] = (200, 1500)  # the user's task, first turn
    tool_result_tokens: tuple[float, float] = (6.5, 0.9)  # lognormal (mu, sigma): ~660 tokens median
    output_tokens: tuple[int, int] = (20, 400)  # a tool call or a short answer (uniform)
    # lognormal tool gap between turns: ~30 s median, ~50 s mean (test runs, builds, searches),
    # long enough that the sessions in flight outgrow 16 H100s' GPU KV (~6.7 M tokens)
    gap_s: tuple[float, float] = (3.4, 1.0)
    max_input_tokens: int = 120_000


_DEFAULT = ToolAgentShape()


def generate(shape: ToolAgentShape, seed: int) -> list[dict[str, object]]:
    """The trace's records in arrival order (timestamps in whole milliseconds)."""
    rng = np.random.default_rng(seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    system = fresh(shape.system_blocks)
    prefixes = [system + fresh(int(rng.integers(shape.prefix_blocks[0], shape.prefix_blocks[1] + 1)))
                for _ in range(shape.agents)]
    weights = 1.0 / np.arange(1, shape.agents + 1) ** shape.agent_zipf
    weights /= weights.sum()
    heap: list[tuple[int, int, int, dict[str, object]]] = []  # (ms, episode, turn, record)
    for ep, start in enumerate(_bursty_arrivals(shape, rng)):
        agent = int(rng.choice(shape.agents, p=weights))
        ids = list(prefixes[agent])
        tokens = len(ids) * BLOCK  # the prefix is whole blocks
        t = start
        for turn in range(int(rng.integers(shape.turns[0], shape.turns[1] + 1))):
            if turn == 0:
                added = int(rng.integers(shape.task_tokens[0], shape.task_tokens[1] + 1))
            else:
                t += float(rng.lognormal(*shape.gap_s))
                added = int(rng.lognormal(*shape.tool_result_tokens))
            if tokens + added > shape.max_input_tokens:
                break
            ids, tokens = _append(ids, tokens, added, fresh)
            out = int(rng.integers(shape.output_tokens[0], shape.output_tokens[1] + 1))
            ms = round(t * 1000.0)
            heapq.heappush(heap, (ms, ep, turn, {"timestamp": ms, "input_length": tokens, "output_length": out,
                                                 "hash_ids": list(ids), "session_id": f"ep-{ep}"}))
            ids, tokens = _append(ids, tokens, out, fresh)  # the reply is part of the next prompt
    return [heapq.heappop(heap)[3] for _ in range(len(heap))]


def _append(ids: list[int], tokens: int, added: int, fresh: Callable[[int], list[int]]) -> tuple[list[int], int]:
    """``ids`` (covering ``tokens``) after ``added`` more tokens: the partial last block gets
    new text, so it and the blocks after it get new ids."""
    full = tokens // BLOCK
    tokens += added
    return ids[:full] + fresh(math.ceil(tokens / BLOCK) - full), tokens


def _bursty_arrivals(shape: ToolAgentShape, rng: np.random.Generator) -> list[float]:
    """Episode starts: a Poisson process whose rate alternates between a high and a low
    phase every half ``burst_period_s`` (mean ``episodes_per_s``)."""
    low = 2.0 * shape.episodes_per_s / (1.0 + shape.burst_factor)
    high = low * shape.burst_factor
    half = shape.burst_period_s / 2.0
    out: list[float] = []
    t = 0.0
    while True:
        rate = high if int(t // half) % 2 == 0 else low
        t += float(rng.exponential(1.0 / rate))
        if t > shape.duration_s:
            return out
        out.append(t)


def write_trace(path: Path, shape: ToolAgentShape, seed: int) -> int:
    """Write the trace to ``path``; returns the number of requests."""
    records = generate(shape, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, separators=(", ", ": ")) + "\n")
    return len(records)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="write a tool-agent-shaped trace in the Mooncake format")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration-s", type=float, default=_DEFAULT.duration_s)
    ap.add_argument("--episodes-per-s", type=float, default=_DEFAULT.episodes_per_s)
    args = ap.parse_args(argv)
    shape = ToolAgentShape(duration_s=args.duration_s, episodes_per_s=args.episodes_per_s)
    n = write_trace(args.out, shape, args.seed)
    print(f"{n} requests -> {args.out}")


if __name__ == "__main__":
    main()
