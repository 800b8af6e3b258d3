"""The routers compared by ``taskplane bench --engine vllm`` and how each is started.

taskplane's gateway runs from this venv (``python -m taskplane.cli gateway``). The peers
(sglang-router, vllm-router) run from their own venv, installed from PyPI by
``scripts/install-peers.sh`` (never vendored), with the command lines docs/vllm.md
records. "round-robin" has no router: the client takes the replicas in turn.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from taskplane.bench.real_client import HeaderStyle
from taskplane.bench.real_workload import CPU_TENANTS
from taskplane.engines.vllm_launcher import BLOCK_SIZE, VllmReplica
from taskplane.errors import UserError

PEERS_VENV_ENV = "TASKPLANE_PEERS_VENV"
_PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class RouterSpec:
    name: str
    kind: str  # "taskplane" | "sglang" | "vllm-router" | "none"
    policy: str  # the router's own policy name
    summary: str
    headers: HeaderStyle

    @property
    def needs_peers(self) -> bool:
        return self.kind in ("sglang", "vllm-router")


ROUTERS: dict[str, RouterSpec] = {
    r.name: r
    for r in (
        RouterSpec("taskplane", "taskplane", "taskplane",
                   "taskplane gateway, policy preset 'taskplane' (KV events, admission control)", "taskplane"),
        RouterSpec("sglang-cache-aware", "sglang", "cache_aware",
                   "sglang-router --policy cache_aware --disable-circuit-breaker", "session"),
        RouterSpec("vllm-router-cache-aware", "vllm-router", "cache_aware",
                   "vllm-router --policy cache_aware (workers with --enable-scale-out)", "session"),
        RouterSpec("vllm-router-kv-aware", "vllm-router", "kv_aware",
                   "vllm-router --policy kv_aware, KV events, session affinity TTL 600 s", "session"),
        RouterSpec("vllm-router-consistent-hash", "vllm-router", "consistent_hash",
                   "vllm-router --policy consistent_hash on X-Session-ID", "session"),
        RouterSpec("round-robin", "none", "round_robin",
                   "no router: the client takes the replicas in turn", "session"),
    )
}


def parse_routers(spec: str | None) -> list[RouterSpec]:
    if spec is None or spec.strip() in ("", "all"):
        return list(ROUTERS.values())
    names = [p.strip() for p in spec.split(",") if p.strip()]
    unknown = [n for n in names if n not in ROUTERS]
    if unknown:
        raise UserError(f"--engine vllm: unknown router {', '.join(unknown)}; choose from "
                        f"{', '.join(ROUTERS)} (or 'all')")
    return [ROUTERS[n] for n in dict.fromkeys(names)]


def peers_python() -> Path | None:
    """The peer routers' venv interpreter, or None when scripts/install-peers.sh has not run."""
    venv = Path(os.environ.get(PEERS_VENV_ENV, _PROJECT_ROOT / ".venv-peers"))
    python = venv / "bin" / "python"
    return python if python.exists() and (venv / ".taskplane-peers-stamp").exists() else None


def require_peers_python() -> Path:
    python = peers_python()
    if python is None:
        raise UserError("the peer routers are not installed: run scripts/install-peers.sh "
                        f"(or point {PEERS_VENV_ENV} at a venv it created), or leave them out with --policies")
    return python


def gateway_config(
    replicas: Sequence[VllmReplica], *, num_blocks: int, max_context_tokens: int, outbox: Path
) -> dict[str, Any]:
    """The gateway YAML (as data) for taskplane's run: the replicas with their KV events,
    the workload's tenants with their priority caps, no auth, no database."""
    return {
        "pools": [{
            "model": replicas[0].model,
            "max_context_tokens": max_context_tokens,
            "replicas": [
                {"url": r.url, "gpu": "cpu", "name": f"replica-{r.index}", "kv_events": r.kv_events,
                 "kv_replay": r.replay, "block_size": BLOCK_SIZE, "kv_blocks": num_blocks}
                for r in replicas
            ],
        }],
        "tenants": [{"id": t.name, "max_priority": t.priority, "weight": t.weight} for t in CPU_TENANTS],
        "scheduler": {"policy": "taskplane"},
        "auth": False,
        "limits": {"request_timeout_s": 300.0},
        "outbox_dir": str(outbox),
    }


def router_command(
    spec: RouterSpec, replicas: Sequence[VllmReplica], *, port: int, metrics_port: int, work: Path,
    num_blocks: int, max_context_tokens: int,
) -> list[str]:
    """The command line that starts ``spec``'s router on ``port`` in front of ``replicas``."""
    urls = [r.url for r in replicas]
    common = ["--host", "127.0.0.1", "--port", str(port)]
    if spec.kind == "taskplane":
        cfg = work / "gateway.yaml"
        cfg.write_text(yaml.safe_dump(gateway_config(replicas, num_blocks=num_blocks,
                                                     max_context_tokens=max_context_tokens,
                                                     outbox=work / "outbox"), sort_keys=False))
        return [sys.executable, "-m", "taskplane.cli", "gateway", "--config", str(cfg), *common]
    python = str(require_peers_python())
    prom = ["--prometheus-port", str(metrics_port)]
    if spec.kind == "sglang":
        # 4xx answers from workers would open sglang-router's circuit breaker.
        return [python, "-m", "sglang_router.launch_router", "--worker-urls", *urls, *common, *prom,
                "--policy", "cache_aware", "--disable-circuit-breaker"]
    if spec.kind == "vllm-router":
        cmd = [python, "-m", "vllm_router.launch_router", "--worker-urls", *urls, *common, *prom,
               "--policy", spec.policy]
        if spec.policy == "kv_aware":
            for r in replicas:
                cmd += ["--kv-event-source", f"{r.url}={r.kv_events}"]
            for r in replicas:
                cmd += ["--kv-event-replay-source", f"{r.url}={r.replay}"]
            cmd += ["--kv-event-block-size", str(BLOCK_SIZE), "--kv-event-model", replicas[0].model,
                    "--kv-aware-session-affinity-ttl-secs", "600"]
        return cmd
    raise ValueError(f"router {spec.name} has no process")
