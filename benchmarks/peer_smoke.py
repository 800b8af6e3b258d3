"""Check that the peer routers (sglang-router, vllm-router) run in front of real vLLM
replicas here, and record how each one places a multi-turn session. Groundwork for
``taskplane bench --engine vllm``; prints one JSON object.

    scripts/install-vllm.sh && scripts/install-peers.sh
    .venv/bin/python -m benchmarks.peer_smoke

Everything it starts, it stops. The command lines it uses are in docs/vllm.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from taskplane.engines.metrics import parse_metrics
from taskplane.engines.vllm_launcher import VllmOptions, VllmReplica, start_replicas, stop_replicas
from taskplane.ports import free_ports

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(os.environ.get("TASKPLANE_PEERS_VENV", ROOT / ".venv-peers")) / "bin" / "python"
MODEL = "tiny-llama"


def router_commands(replicas: list[VllmReplica], port: int, metrics_port: int) -> dict[str, list[str]]:
    urls = [r.url for r in replicas]
    common = ["--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(metrics_port)]
    sglang = [str(PEERS), "-m", "sglang_router.launch_router", "--worker-urls", *urls, *common]
    vllm = [str(PEERS), "-m", "vllm_router.launch_router", "--worker-urls", *urls, *common]
    kv_sources = [a for r in replicas for a in ("--kv-event-source", f"{r.url}={r.kv_events}")]
    kv_replays = [a for r in replicas for a in ("--kv-event-replay-source", f"{r.url}={r.replay}")]
    return {
        # 4xx answers from workers would open sglang-router's circuit breaker.
        "sglang-router cache_aware": [*sglang, "--policy", "cache_aware", "--disable-circuit-breaker"],
        # vllm-router's cache_aware needs the workers' scale-out endpoints (--enable-scale-out).
        "vllm-router cache_aware": [*vllm, "--policy", "cache_aware"],
        "vllm-router kv_aware": [*vllm, "--policy", "kv_aware", *kv_sources, *kv_replays,
                                 "--kv-event-block-size", "128", "--kv-event-model", MODEL,
                                 "--kv-aware-session-affinity-ttl-secs", "600"],
        "vllm-router consistent_hash": [*vllm, "--policy", "consistent_hash"],
    }


def _prompt_tokens(client: httpx.Client, replicas: list[VllmReplica]) -> dict[int, float]:
    return {r.index: parse_metrics(client.get(r.metrics_url).text).prompt_tokens for r in replicas}


def _session(client: httpx.Client, base: str, replicas: list[VllmReplica]) -> dict[str, object]:
    session = uuid.uuid4().hex
    messages = [{"role": "system", "content": uuid.uuid4().hex * 10}, {"role": "user", "content": uuid.uuid4().hex * 6}]
    placed, cached = [], []
    for turn in range(4):
        before = _prompt_tokens(client, replicas)
        resp = client.post(f"{base}/v1/chat/completions", headers={"X-Session-ID": session},
                           json={"model": MODEL, "messages": messages, "max_tokens": 16})
        resp.raise_for_status()
        after = _prompt_tokens(client, replicas)
        body = resp.json()
        details = body["usage"].get("prompt_tokens_details") or {}
        cached.append(details.get("cached_tokens"))
        # Where did it run? The replica whose prompt counters moved (one call at a time here).
        moved = [i for i in after if after[i] != before[i]]
        placed.append(moved[0] if moved else None)
        messages += [body["choices"][0]["message"], {"role": "user", "content": f"turn {turn} " + uuid.uuid4().hex * 4}]
    return {"replica_per_turn": placed, "cached_tokens_per_turn": cached}


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"router exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("router not ready")


def main() -> None:
    if not PEERS.exists():
        raise SystemExit("peer routers not installed: run scripts/install-peers.sh")
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="taskplane-peers-") as tmp:
        replicas = start_replicas(Path(tmp), 2, VllmOptions(model_name=MODEL, num_blocks=64, extra_args=["--enable-scale-out"]))
        try:
            with httpx.Client(timeout=300.0) as client:
                port, metrics_port = free_ports(2)
                for name, cmd in router_commands(replicas, port, metrics_port).items():
                    log = Path(tmp) / f"{name.replace(' ', '_')}.log"
                    with log.open("wb") as f:
                        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
                    try:
                        ready_s = _wait_http(f"http://127.0.0.1:{port}/v1/models", proc)
                        out[name] = {"ready_s": round(ready_s, 1),
                                     **_session(client, f"http://127.0.0.1:{port}", replicas)}
                    except Exception as exc:
                        out[name] = {"error": str(exc), "log_tail": log.read_text(errors="replace")[-1500:]}
                    finally:
                        os.killpg(proc.pid, signal.SIGTERM)
                        try:
                            proc.wait(timeout=10)
                        except subprocess.TimeoutExpired:
                            os.killpg(proc.pid, signal.SIGKILL)
                            proc.wait()
        finally:
            stop_replicas(replicas)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
