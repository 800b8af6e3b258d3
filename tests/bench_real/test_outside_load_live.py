"""vLLM's own load generator (``vllm bench serve``) against taskplane's gateway and a
round-robin Envoy on the same simulated replicas: every request of both answered."""

from __future__ import annotations

import pytest

from benchmarks.outside_load import FIGURES, bench


@pytest.mark.vllm
def test_both_targets_serve_every_request_of_both_scenarios() -> None:
    res = bench(sessions=4, rounds=1, burst_prompts=12, concurrency=4)
    for scenario in ("agent-sessions", "burst"):
        (rnd,) = res["scenarios"][scenario]
        want = 12 if scenario == "burst" else res["calls"]
        for target in ("round-robin", "taskplane"):
            fig = rnd["runs"][target]
            assert (fig["completed"], fig["failed"]) == (want, 0), (scenario, target, fig)
            assert fig["mean_ttft_ms"] > 0
        assert set(rnd["ratios"]) == set(FIGURES) and all(v is not None for v in rnd["ratios"].values())
