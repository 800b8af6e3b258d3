"""Envoy's own counters for the replicas cluster, read from its admin port around a load phase.

Why a try failed and was retried is in Envoy's counters, not in taskplane's rows (a row
says only "replica_error, then served by a fallback"): connection failures and timeouts,
resets, connections the replica closed with a request on them, pending-queue overflows.
The bench reads them before and after a phase and keeps the counters that moved.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import psutil

from taskplane.epp.envoy_names import REPLICA_CLUSTER

#: The replica cluster's counters that say why a try failed or was retried (suffixes of
#: ``cluster.<name>.``); every other counter is left out of the report.
WHY = (
    "upstream_rq_retry", "upstream_rq_retry_success", "upstream_rq_retry_overflow", "upstream_rq_retry_backoff_exponential",
    "upstream_rq_pending_overflow", "upstream_rq_pending_failure_eject", "upstream_rq_rx_reset", "upstream_rq_tx_reset",
    "upstream_rq_timeout", "upstream_rq_per_try_timeout", "upstream_rq_per_try_idle_timeout", "upstream_rq_5xx",
    "upstream_rq_503", "upstream_rq_maintenance_mode", "upstream_cx_total", "upstream_cx_connect_fail",
    "upstream_cx_connect_timeout", "upstream_cx_destroy_remote_with_active_rq", "upstream_cx_destroy_local_with_active_rq",
    "upstream_cx_destroy_remote", "upstream_cx_close_notify", "upstream_cx_protocol_error", "upstream_cx_overflow",
    "upstream_cx_idle_timeout", "upstream_cx_max_requests", "upstream_cx_pool_overflow",
    "upstream_rq_max_duration_reached", "retry_or_shadow_abandoned",
)


def admin_port(gateway_pid: int) -> int | None:
    """Envoy's admin port under a front-door process (from its bootstrap file), or None
    when the gateway runs no Envoy (the Python proxy)."""
    try:
        children = psutil.Process(gateway_pid).children(recursive=True)
    except psutil.Error:
        return None
    for child in children:
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if "-c" in cmd and any(Path(c).name == "envoy" for c in cmd[:1]):
            config = json.loads(Path(cmd[cmd.index("-c") + 1]).read_text())
            return int(config["admin"]["address"]["socket_address"]["port_value"])
    return None


async def replica_counters(port: int | None) -> dict[str, int]:
    """The ``WHY`` counters of the replica cluster now ({} without an Envoy)."""
    if port is None:
        return {}
    prefix = f"cluster.{REPLICA_CLUSTER}."
    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
        stats = (await client.get(f"http://127.0.0.1:{port}/stats", params={"format": "json", "filter": f"^{prefix}"})).json()
    out: dict[str, int] = {}
    for s in stats.get("stats", []):
        name = str(s.get("name", ""))
        if name.startswith(prefix) and name[len(prefix):] in WHY and "value" in s:
            out[name[len(prefix):]] = int(s["value"])
    return out


def moved(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that changed between two readings, by how much."""
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v != before.get(k, 0)}
