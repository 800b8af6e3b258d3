"""The seeded tool-agent trace in the Mooncake format: the format's invariants, determinism,
and a replay through the same loader as the real trace."""

from __future__ import annotations

import math
from pathlib import Path

from taskplane.bench.ceiling import hit_ceiling
from taskplane.bench.tracegen import ToolAgentShape, generate, main
from taskplane.sim.workloads.mooncake import load_mooncake

SMALL = ToolAgentShape(duration_s=60.0, episodes_per_s=1.0)


def test_records_keep_the_mooncake_format() -> None:
    recs = generate(SMALL, seed=3)
    assert len(recs) > 100
    stamps = [r["timestamp"] for r in recs]
    assert stamps == sorted(stamps)
    for r in recs:
        ids, n = r["hash_ids"], r["input_length"]
        assert isinstance(n, int) and isinstance(ids, list)
        assert len(ids) == math.ceil(n / 512)
        assert ids[0] == 0  # one system-prompt block shared by every request, as in Mooncake
        assert 1 <= int(r["output_length"]) <= SMALL.output_tokens[1]  # type: ignore[call-overload]


def test_a_seed_gives_the_same_trace_and_another_seed_another() -> None:
    assert generate(SMALL, seed=3) == generate(SMALL, seed=3)
    assert generate(SMALL, seed=3) != generate(SMALL, seed=4)


def test_the_loader_replays_it_with_multi_turn_sessions_and_a_high_ceiling(tmp_path: Path) -> None:
    out = tmp_path / "toolagent.jsonl"
    main(["--out", str(out), "--seed", "3", "--duration-s", "60", "--episodes-per-s", "1.0"])
    wl = load_mooncake(out)
    assert wl.meta["requests"] == len(generate(SMALL, seed=3))
    # one session per episode (the lines name it), each of several turns
    episodes = {r["session_id"] for r in generate(SMALL, seed=3)}
    assert len(wl.tasks) == len(episodes) > SMALL.agents
    assert min(len(t.calls) for t in wl.tasks) >= 1 and max(len(t.calls) for t in wl.tasks) >= SMALL.turns[0]
    # long shared tool prefixes + appended turns: far above the conversation trace's 37 %
    assert hit_ceiling(wl) > 0.7
