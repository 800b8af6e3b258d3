"""A gateway process whose pool comes from Kubernetes discovery (the fake API server that
speaks the real EndpointSlice list/watch protocol) in front of real simulated replicas:
replicas that scale up join and serve, replicas that scale down leave — no restart."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import yaml
from fake_kube import FakeKubeApi, endpoint_slice, serve

from taskplane.dev import processes as proc
from taskplane.ports import free_port

NS, SVC = "taskplane", "vllm-llama"


async def _replicas(gw: str) -> set[str]:
    async with httpx.AsyncClient(timeout=5) as c:
        reps = (await c.get(f"{gw}/admin/replicas")).json()["replicas"]
    return {r["url"] for r in reps if r["healthy"]}


async def _eventually(gw: str, want: set[str]) -> set[str]:
    got: set[str] = set()
    for _ in range(100):
        got = await _replicas(gw)
        if got == want:
            return got
        await asyncio.sleep(0.1)
    return got


async def test_replicas_join_and_leave_a_running_gateway(tmp_path: Path) -> None:
    port, kv = free_port(), free_port()
    pids = []
    try:
        for host in ("127.0.0.2", "127.0.0.3"):  # two "pods" with their own IPs, same ports
            pid = proc.spawn([sys.executable, "-m", "taskplane.cli", "sim-engine", "--host", host, "--port", str(port),
                              "--kv-events-port", str(kv), "--speed", "50"], tmp_path / f"{host}.log")
            pids.append(pid)
            proc.wait_until(proc.http_ok(f"http://{host}:{port}/health"), host, 60, pid, tmp_path / f"{host}.log")
        api = FakeKubeApi(token=None)
        ports = {"http": port, "kv-events": kv}
        await api.put("endpointslices", endpoint_slice("vllm-llama-a", NS, SVC, [("pod-a", "127.0.0.2", True)], ports))
        async with serve(api) as api_url:
            cfg = {"pools": [{"model": "llama-3.1-8b", "discovery": {"service": SVC, "namespace": NS, "api_url": api_url}}],
                   "auth": False, "tenants": [{"id": "acme", "max_priority": "critical"}]}
            cfg_file = tmp_path / "gw.yaml"
            cfg_file.write_text(yaml.safe_dump(cfg))
            gw_port = free_port()
            gw = f"http://127.0.0.1:{gw_port}"
            pid = proc.spawn([sys.executable, "-m", "taskplane.cli", "gateway", "--config", str(cfg_file), "--port", str(gw_port)],
                             tmp_path / "gw.log", env={"TASKPLANE_STATE_DIR": str(tmp_path)})
            pids.append(pid)
            async with httpx.AsyncClient(timeout=1) as c:
                for _ in range(300):
                    try:
                        if (await c.get(f"{gw}/healthz")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    await asyncio.sleep(0.1)
            a, b = f"http://127.0.0.2:{port}", f"http://127.0.0.3:{port}"
            assert await _eventually(gw, {a}) == {a}

            await api.put("endpointslices", endpoint_slice("vllm-llama-a", NS, SVC,
                                                           [("pod-a", "127.0.0.2", True), ("pod-b", "127.0.0.3", True)], ports))
            assert await _eventually(gw, {a, b}) == {a, b}

            await api.put("endpointslices", endpoint_slice("vllm-llama-a", NS, SVC, [("pod-b", "127.0.0.3", True)], ports))
            assert await _eventually(gw, {b}) == {b}
            async with httpx.AsyncClient(timeout=30) as c:
                r = await c.post(f"{gw}/v1/chat/completions", headers={"X-Taskplane-Tenant": "acme"},
                                 json={"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            assert r.status_code == 200, r.text
            assert r.headers["X-Taskplane-Replica"] == "pod-b"
    finally:
        for pid in pids:
            proc.stop_pid(pid, timeout_s=3)
