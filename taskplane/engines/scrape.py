"""What one scrape of a replica's ``/metrics`` and ``/health`` says about it.

Refused or reset: the replica is gone. A timeout may be overload: only after a few in a
row do the calls waiting on it give up. ``/metrics`` answering while ``/health`` does
not is a hang only if the engine also makes no progress (a busy engine's token counters
move). A sleeping engine (vLLM sleep mode) answers ``/health`` but takes no calls.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx
import structlog

from taskplane.engines.probe import Page, ProbeConnectError
from taskplane.engines.replica import ReplicaState

if TYPE_CHECKING:
    from taskplane.engines.metrics import MetricsSnapshot

log = structlog.get_logger("taskplane.engines.registry")

#: Probe timeouts in a row before calls waiting on the replica give up on it.
PROBE_FAILURES_DOWN = 3

Answer = Page | httpx.Response | BaseException


def apply_scrape(s: ReplicaState, metrics_call: Answer, health_call: Answer) -> bool:
    """Update ``s`` from one scrape's two answers; True when it came (back) up."""
    from taskplane.engines.metrics import parse_metrics

    try:
        if isinstance(metrics_call, BaseException):
            raise metrics_call
        metrics_call.raise_for_status()
        m = parse_metrics(metrics_call.text)
    except Exception as exc:
        _unreachable(s, exc)
        return False
    progress = float(m.prompt_tokens) + float(m.generation_tokens)
    if progress != s.progress_tokens or s.inflight == 0:
        s.progress_tokens, s.progress_at = progress, time.monotonic()
    health_ok = not isinstance(health_call, BaseException) and health_call.status_code == 200
    if not health_ok and _hung(s, health_call):
        return False
    s.probe_failures = 0
    if m.sleeping:  # answers /health, but takes no calls until woken: out of placement
        if not s.sleeping:
            log.info("replica_sleeping", replica=s.name)
        s.sleeping, s.healthy = True, False
        s.kv_usage, s.num_running, s.num_waiting = 0.0, 0, 0
        return False
    s.sleeping = False
    was = s.healthy
    _apply_metrics(s, m)
    if not was:
        log.info("replica_up", replica=s.name)
    return not was


def _unreachable(s: ReplicaState, exc: Exception) -> None:
    s.probe_failures += 1
    gone = isinstance(exc, httpx.ConnectError | ProbeConnectError) or (
        s.probe_failures >= PROBE_FAILURES_DOWN and s.stalled())
    if s.healthy:
        log.warning("replica_unreachable", replica=s.name, error=type(exc).__name__)
    s.healthy = False
    if gone:
        s.signal_down()


def _hung(s: ReplicaState, health_call: Answer) -> bool:
    """``/metrics`` answers but ``/health`` does not: marked unhealthy (True) unless it is
    busy and still making progress."""
    stalled = s.stalled()
    if not (s.inflight == 0 or stalled):
        return False
    if s.healthy:
        log.warning("replica_unhealthy", replica=s.name, stalled=stalled,
                    error=type(health_call).__name__ if isinstance(health_call, BaseException)
                    else health_call.status_code)
    s.healthy = False
    if stalled:
        s.signal_down()
    return True


def _apply_metrics(s: ReplicaState, m: MetricsSnapshot) -> None:
    s.healthy = True
    s.consecutive_failures = 0
    s.down_until = 0.0
    s.num_running = int(m.num_running)
    s.num_waiting = int(m.num_waiting)
    s.kv_usage = float(m.kv_cache_usage)
    if m.num_gpu_blocks:
        s.kv_blocks_total = int(m.num_gpu_blocks)
    if m.block_size:
        s.block_size = int(m.block_size)
    s.prefix_queries = float(m.prefix_cache_queries)
    s.prefix_hits = float(m.prefix_cache_hits)
    if m.max_loras or s.max_loras:  # unchanged (no view refresh) on replicas without LoRA
        s.max_loras, s.lora_running, s.lora_waiting = m.max_loras, m.lora_running, m.lora_waiting


def apply_models(s: ReplicaState, models_call: Answer) -> None:
    """Update ``s.lora_served`` from the replica's ``/v1/models``: vLLM lists each registered
    adapter as a model whose ``parent`` is the base model. An unreadable answer leaves it."""
    import json

    try:
        if isinstance(models_call, BaseException):
            raise models_call
        models_call.raise_for_status()
        cards = json.loads(models_call.text).get("data") or []
        adapters = [c for c in cards if isinstance(c, dict) and c.get("parent") and c.get("id")]
        served = frozenset(str(c["id"]) for c in adapters)
        s.lora_roots = {str(c["id"]): str(c["root"]) for c in adapters if c.get("root")}
    except Exception as exc:
        log.debug("models_unreadable", replica=s.name, error=type(exc).__name__)
        return
    if served != s.lora_served:
        if s.lora_served is not None:
            log.info("replica_adapters", replica=s.name, adapters=sorted(served))
        s.lora_served = served
