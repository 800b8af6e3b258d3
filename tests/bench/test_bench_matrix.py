"""The robustness matrix: real (tiny) bench runs per cell, ratios oriented so >1 favours taskplane."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskplane.bench.matrix import (
    AUTOSCALE,
    KV_TIERS,
    PLACEMENT,
    Cell,
    Family,
    cells,
    run_cells,
    run_matrix,
    score,
)
from taskplane.errors import UserError


def _tiny_trace(path: Path) -> Path:
    lines = []
    for i in range(30):
        ids = [0] + [100 * (i % 3) + k + 1 for k in range(2 + i // 3)]
        lines.append(json.dumps({"timestamp": i * 700, "input_length": len(ids) * 512 - 100,
                                 "output_length": 40, "hash_ids": ids}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_score_orients_lower_is_better_figures() -> None:
    results = {"policies": {"taskplane": {"ttft_p50_ms": 50.0}, "round-robin": {"ttft_p50_ms": 200.0},
                            "llm-d-tiered": {"ttft_p50_ms": 100.0}}}
    s = score(KV_TIERS, results)
    assert (s["best_baseline"], s["baseline"], s["ratio"]) == ("llm-d-tiered", 100.0, 2.0)


def test_score_of_autoscalers_reads_their_section() -> None:
    results = {"autoscalers": {"taskplane": {"goodput_per_gpu_hour": 90.0},
                               "aibrix-kpa": {"goodput_per_gpu_hour": 100.0},
                               "fixed-peak": {"goodput_per_gpu_hour": 60.0}}}
    s = score(AUTOSCALE, results)
    assert (s["best_baseline"], s["ratio"]) == ("aibrix-kpa", 0.9)


def test_every_family_has_held_out_cells(tmp_path: Path) -> None:
    every = cells(tmp_path / "t.jsonl")
    slugs = [c.slug for c in every]
    assert len(set(slugs)) == len(slugs)
    for family in (PLACEMENT, KV_TIERS, AUTOSCALE):
        mine = [c for c in every if c.family is family]
        assert len(mine) >= 3, family.name
    assert any(c.args.get("trace") for c in every), "a second trace"
    assert {c.args.get("seed") for c in every} >= {1, 2, 3}
    assert {c.args.get("hints") for c in every} >= {"none", "noisy", "exact"}


def test_unknown_cell_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="matches no cell"):
        run_matrix(tmp_path, only="no-such-cell")


def test_a_real_cell_runs_and_writes_the_table(tmp_path: Path) -> None:
    tiny = Family("kv-tiers", "mooncake", "ttft_p50_ms", "TTFT p50", lower_is_better=True,
                  defaults={"replicas": 2, "policies": "round-robin,session-hash,taskplane",
                            "trace": _tiny_trace(tmp_path / "tiny.jsonl")})
    doc = run_cells(tmp_path / "m", [Cell(tiny, "tiny trace")])
    (row,) = doc["cells"]
    assert row["best_baseline"] in ("round-robin", "session-hash")
    assert row["ratio"] == pytest.approx(row["baseline"] / row["taskplane"], rel=1e-2)
    assert (tmp_path / "m" / "kv-tiers-tiny-trace" / "results.json").is_file()
    assert "tiny trace" in (tmp_path / "m" / "matrix.md").read_text()
    assert json.loads((tmp_path / "m" / "matrix.json").read_text())["worst_ratio"] == row["ratio"]
