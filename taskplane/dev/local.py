"""A small local cluster of real processes — simulated replicas and a gateway — on free
ports, for tests, benchmarks and examples that need the HTTP path without the full dev
stack (no Temporal). Everything it starts, ``stop()`` stops.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from taskplane.dev import processes as proc
from taskplane.ports import free_port


@dataclass
class LocalReplica:
    name: str
    gpu: str
    port: int
    kv_port: int
    pid: int | None = None
    extra_args: list[str] = field(default_factory=list)
    model: str = "llama-3.1-8b"
    max_num_seqs: int = 256

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def kv_events(self) -> str:
        return f"tcp://127.0.0.1:{self.kv_port}"

    @property
    def kv_replay(self) -> str:
        return f"tcp://127.0.0.1:{self.kv_port + 1000}"  # the sim's default replay port


class LocalCluster:
    """N ``taskplane sim-engine`` processes behind one ``taskplane gateway`` process."""

    def __init__(
        self,
        workdir: Path,
        *,
        replicas: int = 2,
        gpus: list[str] | None = None,
        database_url: str | None = None,
        model: str = "llama-3.1-8b",
        speed: float = 50.0,
        kv_blocks: int = 2048,
        config_overrides: dict[str, Any] | None = None,
        replica_args: list[str] | None = None,
        models: list[str] | None = None,
        fallbacks: dict[str, str] | None = None,
        max_num_seqs: int = 256,
        data_plane: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.data_plane = data_plane  # `taskplane gateway --data-plane` (None: the CLI's default, Envoy)
        self.database_url = database_url
        self.model = model
        self.speed = speed
        self.kv_blocks = kv_blocks
        self.config_overrides = config_overrides or {}
        gpus = gpus or ["h100"]
        models = models or [model]
        self.fallbacks = fallbacks or {}
        self.replicas = [
            LocalReplica(f"replica-{i}", gpus[i % len(gpus)], free_port(), free_port(), extra_args=list(replica_args or []),
                         model=models[i % len(models)], max_num_seqs=max_num_seqs)
            for i in range(replicas)
        ]
        self.gateway_port = free_port()
        self.gateway_pid: int | None = None
        self._extra_pids: list[int] = []

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def _log(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def start_replica(self, r: LocalReplica) -> None:
        cmd = [sys.executable, "-m", "taskplane.cli", "sim-engine", "--port", str(r.port), "--gpu", r.gpu, "--model", r.model,
               "--kv-blocks", str(self.kv_blocks), "--kv-events-port", str(r.kv_port), "--speed", str(self.speed),
               "--max-num-seqs", str(r.max_num_seqs), *r.extra_args]
        r.pid = proc.spawn(cmd, self._log(r.name))
        proc.wait_until(proc.http_ok(f"{r.url}/health"), r.name, 60, r.pid, self._log(r.name))

    def kill_replica(self, index: int) -> None:
        r = self.replicas[index]
        proc.stop_pid(r.pid, timeout_s=2)
        r.pid = None

    def config(self) -> dict[str, Any]:
        pools: dict[str, dict[str, Any]] = {}
        for r in self.replicas:
            pool = pools.setdefault(r.model, {"model": r.model, "max_context_tokens": 8192, "replicas": []})
            if r.model in self.fallbacks:
                pool["fallback"] = self.fallbacks[r.model]
            pool["replicas"].append({"url": r.url, "gpu": r.gpu, "kv_events": r.kv_events, "kv_replay": r.kv_replay,
                                     "name": r.name, "max_num_seqs": r.max_num_seqs})
        cfg: dict[str, Any] = {
            "pools": list(pools.values()),
            "tenants": [{"id": "acme", "max_priority": "critical", "weight": 2.0},
                        {"id": "globex", "max_priority": "interactive"},
                        {"id": "default", "max_priority": "interactive"}],
            "auth": False,
            "outbox_dir": str(self.workdir / "outbox"),
        }
        cfg.update(self.config_overrides)
        return cfg

    def _gateway_env(self) -> dict[str, str]:
        env = {"TASKPLANE_STATE_DIR": str(self.workdir)}
        if self.database_url:
            env["TASKPLANE_DATABASE_URL"] = self.database_url
        if self.data_plane:
            env["TASKPLANE_DATA_PLANE"] = self.data_plane
        return env

    def start_gateway(self) -> None:
        cfg_file = self.workdir / "gateway.yaml"
        cfg_file.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        env = self._gateway_env()
        self.gateway_pid = proc.spawn(
            [sys.executable, "-m", "taskplane.cli", "gateway", "--config", str(cfg_file), "--port", str(self.gateway_port)],
            self._log("gateway"), env=env,
        )
        proc.wait_until(proc.http_ok(f"{self.gateway_url}/healthz"), "gateway", 60, self.gateway_pid, self._log("gateway"))

    def stop_gateway(self) -> None:
        proc.stop_pid(self.gateway_pid)
        self.gateway_pid = None

    def add_gateway(self) -> tuple[str, int]:
        """Another gateway over the same replicas (gateways share no state); returns (url, pid)."""
        port = free_port()
        cfg_file = self.workdir / f"gateway-{port}.yaml"
        cfg = self.config()
        cfg["outbox_dir"] = str(self.workdir / f"outbox-{port}")
        cfg_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
        env = self._gateway_env()
        log = self._log(f"gateway-{port}")
        pid = proc.spawn([sys.executable, "-m", "taskplane.cli", "gateway", "--config", str(cfg_file), "--port", str(port)], log, env=env)
        self._extra_pids.append(pid)
        url = f"http://127.0.0.1:{port}"
        proc.wait_until(proc.http_ok(f"{url}/healthz"), "gateway", 60, pid, log)
        return url, pid

    def start(self) -> LocalCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for r in self.replicas:
                self.start_replica(r)
            self.start_gateway()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.stop_gateway()
        for pid in self._extra_pids:
            proc.stop_pid(pid)
        self._extra_pids.clear()
        for r in self.replicas:
            proc.stop_pid(r.pid, timeout_s=3)
            r.pid = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
