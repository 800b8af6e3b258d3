"""A smaller run of the gateway load benchmark (python -m taskplane.bench.gateway_load):
hundreds of concurrent streaming calls through a real gateway process, zero errors, and
the figures come out complete. No timing assertions: the numbers are the benchmark's."""

from __future__ import annotations

from pathlib import Path

from taskplane.bench import gateway_load


def test_concurrent_streams_through_the_gateway_have_no_errors(tmp_path: Path) -> None:
    options = gateway_load.LoadOptions(calls=200, replicas=3, max_tokens=16, timeout_s=240, rounds=2)
    res = gateway_load.run(options, workdir=tmp_path)
    print("\n" + gateway_load.render(res))
    assert res["errors"] == {"direct": 0, "gateway": 0}, res["gateway"]["error_samples"]
    assert res["gateway"]["calls"] == 200
    assert [r["errors"] for r in res["rounds"]] == [{"direct": 0, "envoy": 0}] * 2  # direct, then the gateway, twice
    # the warm-ups write rows too (issue 19: a warm-up's 50 refused calls went uncounted)
    assert res["warmup_errors"] == {"envoy": 0} and [r["warmup_errors"] for r in res["rounds"]] == [{"envoy": 0}] * 2
    assert res["served"] == 2 * (200 + 50)  # every round's calls, warm-ups included: what rows are counted against
    ratios = [r["ratio_to_direct"]["envoy"]["ttft_ms"]["p50"] for r in res["rounds"]]
    assert res["ratio_to_direct_median"]["envoy"]["ttft_ms"]["p50"] == round(sum(ratios) / 2, 3)
    for phase in ("direct", "gateway"):
        assert set(res[phase]["ttft_ms"]) >= {"p50", "p90", "p99"}
    assert res["gateway_rss_mb"]["peak"] >= res["gateway_rss_mb"]["before"] > 0
    assert res["gateway_cpu_ms_per_call"] > 0


def test_the_median_ratio_is_taken_per_data_plane_and_percentile_over_the_rounds() -> None:
    rounds = [{"ratio_to_direct": {"envoy": {"ttft_ms": {"p50": r, "p99": 2 * r}}}} for r in (1.4, 0.9, 1.1)]
    rounds[1]["ratio_to_direct"]["envoy"]["ttft_ms"].pop("p99")  # a round whose direct phase had no p99
    assert gateway_load.median_ratios(rounds) == {"envoy": {"ttft_ms": {"p50": 1.1, "p99": 2.5}}}
