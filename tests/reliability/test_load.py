"""A smaller run of the gateway load benchmark (python -m taskplane.bench.gateway_load):
hundreds of concurrent streaming calls through a real gateway process, zero errors, and
the figures come out complete. No timing assertions: the numbers are the benchmark's."""

from __future__ import annotations

from pathlib import Path

from taskplane.bench import gateway_load


def test_concurrent_streams_through_the_gateway_have_no_errors(tmp_path: Path) -> None:
    res = gateway_load.run(calls=300, replicas=3, max_tokens=16, timeout_s=240, workdir=tmp_path)
    print("\n" + gateway_load.render(res))
    assert res["errors"] == {"direct": 0, "gateway": 0}, res["gateway"]["error_samples"]
    assert res["gateway"]["calls"] == 300
    for phase in ("direct", "gateway"):
        assert set(res[phase]["ttft_ms"]) >= {"p50", "p90", "p99"}
    assert res["gateway_rss_mb"]["peak"] >= res["gateway_rss_mb"]["before"] > 0
    assert res["gateway_cpu_ms_per_call"] > 0
