"""`taskplane dev up | status | down` as a user runs them: every part up and reachable,
a second `up` finds the stack, `down` stops exactly what `up` started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from taskplane.dev import processes as proc
from taskplane.dev.ports import free_base
from taskplane.store import embedded


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "taskplane.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ))


def _assert_data_plane(info: dict[str, object]) -> None:
    """Envoy answers on the gateway port; the endpoint picker's gRPC health says SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    chat = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = httpx.post(f"{info['gateway_url']}/v1/chat/completions", json=chat, timeout=30)
    assert r.status_code == 200 and r.headers["server"] == "envoy", r.text
    with grpc.insecure_channel(str(info["epp_address"])) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            got = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert got.status == health_pb2.HealthCheckResponse.SERVING, service


def test_dev_up_status_down(tmp_path: Path) -> None:
    state = tmp_path / "state"
    base = free_base(2)
    up = _cli("dev", "up", "--state-dir", str(state), "--replicas", "2", "--base-port", str(base))
    try:
        assert up.returncode == 0, up.stderr
        status = _cli("dev", "status", "--json", "--state-dir", str(state))
        assert status.returncode == 0
        info = json.loads(status.stdout)
        for key in ("gateway_url", "temporal_address", "temporal_ui_url", "database_url"):
            assert info[key], key
        assert [set(r) >= {"url", "gpu", "metrics_url", "kv_events"} for r in info["replicas"]] == [True, True]
        assert {p["name"] for p in info["parts"]} == {"temporal", "postgres", "replica-0", "replica-1", "gateway", "worker"}
        assert all(p["alive"] for p in info["parts"])
        assert httpx.get(f"{info['gateway_url']}/healthz", timeout=5).json()["healthy_replicas"] == 2
        _assert_data_plane(info)
        assert httpx.get(info["temporal_ui_url"], timeout=10).status_code == 200
        for r in info["replicas"]:
            assert "vllm:num_requests_running" in httpx.get(r["metrics_url"], timeout=5).text

        again = _cli("dev", "up", "--state-dir", str(state), "--replicas", "2", "--base-port", str(base))
        assert again.returncode == 0 and "found the running dev stack" in again.stderr
        assert json.loads(_cli("dev", "status", "--json", "--state-dir", str(state)).stdout)["parts"] == info["parts"]
    finally:
        down = _cli("dev", "down", "--state-dir", str(state))
    assert down.returncode == 0
    for p in info["parts"]:
        if p["name"] == "postgres":
            assert not embedded.is_running(Path(p["data_dir"]))
        else:
            assert not proc.alive(p["pid"]), p["name"]
    gone = _cli("dev", "status", "--json", "--state-dir", str(state))
    assert gone.returncode == 1 and json.loads(gone.stdout)["running"] is False
