"""gateway_load's reading of the picker's timing histograms: a phase is the difference of
two scrapes, and its quantiles are interpolated inside the buckets."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from taskplane.bench.envoy_stats import moved
from taskplane.bench.picker_timing import parse, phase_figures
from taskplane.epp.timing import BurstTiming


def test_a_phase_is_the_difference_of_two_scrapes_with_bucket_quantiles() -> None:
    registry = CollectorRegistry()
    timing = BurstTiming(registry)
    for _ in range(100):
        timing.decision.observe(0.5)  # before the phase: must not count
    before = parse(generate_latest(registry).decode())
    for i in range(100):
        timing.decision.observe(0.002 if i < 90 else 0.2)  # 90 fast decisions, 10 slow ones
    figures = phase_figures(before, parse(generate_latest(registry).decode()))
    d = figures["decision"]
    assert d["n"] == 100
    assert 1.5 <= d["p50"] <= 2.5  # inside the bucket (1.5, 2.5] ms
    assert 150.0 <= d["p99"] <= 250.0  # inside (150, 250] ms
    assert abs(d["mean"] - (90 * 2 + 10 * 200) / 100) < 0.01
    assert "route" not in figures  # nothing observed in the phase: left out


def test_only_the_envoy_counters_that_moved_are_kept() -> None:
    assert moved({"upstream_rq_retry": 2, "upstream_cx_total": 5}, {"upstream_rq_retry": 6, "upstream_cx_total": 5,
                                                                    "upstream_cx_destroy_remote_with_active_rq": 4}) == {
        "upstream_cx_destroy_remote_with_active_rq": 4, "upstream_rq_retry": 4}
