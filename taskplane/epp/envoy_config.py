"""Envoy's bootstrap for taskplane's front door, generated from the gateway config.

Envoy carries the bytes; the endpoint picker (``taskplane.epp.server``) decides. The
inference routes pass through ext_proc (request headers and body to the picker; the
response of anything but a successful stream to it again through a second, matcher-wrapped
ext_proc filter, ``taskplane.answers``) and reach the replica the picker named through Envoy's
``override_host`` load-balancing policy, which reads ``x-gateway-destination-endpoint``
(or the ``envoy.lb`` metadata, the GIE protocol's two carriers) and walks its comma list
on retries. The replica set reaches Envoy as EDS from a file the picker rewrites
atomically (``write_endpoints``), so Envoy follows discovery and scaling without a
restart. A Lua filter scans streamed responses for the usage event (per-chunk work in
Envoy's C++/LuaJIT, not Python) and hands the numbers to the picker through dynamic
metadata in the gRPC access log, and adds a successful stream's X-Taskplane-* headers (the
routing answer left them per endpoint; the route names the endpoint that answered in
``x-taskplane-upstream``), so a stream costs the picker two messages. Everything else (``/v1/models``, ``/healthz``,
``/metrics``, ``/admin/*``, ``/reports``) goes to the Python HTTP app with ext_proc off.
Envoy's own local replies (no route, upstream gone, body too large) are mapped to the
contract's JSON error shape. The filters are in ``envoy_filters``, the routes and the local
replies in ``envoy_routes``, the names all of them and the picker share in ``envoy_names``.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskplane.config import GatewayConfig
from taskplane.engines.keepalive import REPLICA_IDLE_S
from taskplane.epp.envoy_filters import (
    access_log,
    answers_filter,
    ext_proc_filter,
    guard_filter,
    lua_filter,
)
from taskplane.epp.envoy_names import (
    APP_CLUSTER,
    DEST_HEADER,
    EPP_CLUSTER,
    INFERENCE_PATHS,
    LB_NAMESPACE,
    REPLICA_CLUSTER,
    TYPE_URL,
    address,
    duration,
)
from taskplane.epp.envoy_routes import app_route, inference_routes, local_reply_config

_BIG = 1_000_000  # circuit-breaker limits: admission is taskplane's job, not Envoy's


@dataclass(frozen=True)
class FrontDoor:
    """Where each part listens: clients on ``host:port``, the picker, the Python app, Envoy's admin."""

    host: str
    port: int
    epp_port: int
    app_port: int
    admin_port: int
    endpoints_file: Path



def _static_cluster(name: str, port: int, *, http2: bool) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address("127.0.0.1", port)}}]}]},
        "circuit_breakers": {"thresholds": [_thresholds()]},
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": TYPE_URL + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {"max_concurrent_streams": 100_000}},
            }
        }
    return cluster


def _thresholds() -> dict[str, Any]:
    return {"max_connections": _BIG, "max_pending_requests": _BIG, "max_requests": _BIG, "max_retries": _BIG}


def replica_cluster(endpoints_file: Path) -> dict[str, Any]:
    """The replicas: EDS from a watched file; the host comes from the picker's header or
    ``envoy.lb`` metadata (``override_host``), which lists fallbacks in retry order."""
    return {
        "name": REPLICA_CLUSTER,
        "type": "EDS",
        "connect_timeout": "5s",
        "eds_cluster_config": {
            "eds_config": {
                "resource_api_version": "V3",
                "path_config_source": {"path": str(endpoints_file), "watched_directory": {"path": str(endpoints_file.parent)}},
            }
        },
        "circuit_breakers": {"thresholds": [_thresholds()]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": TYPE_URL + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "common_http_protocol_options": {"idle_timeout": duration(REPLICA_IDLE_S)},
            "explicit_http_config": {"http_protocol_options": {}},
        }},
        "load_balancing_policy": {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.override_host",
            "typed_config": {
                "@type": TYPE_URL + "envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                "override_host_sources": [{"header": DEST_HEADER},
                                          {"metadata": {"key": LB_NAMESPACE, "path": [{"key": DEST_HEADER}]}}],
                "fallback_policy": {"policies": [{"typed_extension_config": {
                    "name": "envoy.load_balancing_policies.round_robin",
                    "typed_config": {"@type": TYPE_URL + "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"},
                }}]},
            },
        }}]},
    }

def bootstrap(config: GatewayConfig, door: FrontDoor) -> dict[str, Any]:
    """The whole Envoy bootstrap for one front door (the exchange: ``ext_proc_filter``)."""
    limits = config.limits
    routes = [r for p in INFERENCE_PATHS for r in inference_routes(p, config)] + [app_route("/")]
    hcm = {
        "@type": TYPE_URL + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "taskplane",
        "codec_type": "AUTO",
        "request_headers_timeout": duration(limits.header_timeout_s),
        "stream_idle_timeout": duration(limits.request_timeout_s),  # the app's routes; the inference routes set their own
        "max_request_headers_kb": 64,
        # a malformed request gets its 400 (431, 413) answer, as the contract says, not a dropped connection
        "http_protocol_options": {"override_stream_error_on_invalid_http_message": True},
        "common_http_protocol_options": {"idle_timeout": "60s", "headers_with_underscores_action": "ALLOW"},
        "route_config": {"name": "taskplane", "virtual_hosts": [{"name": "taskplane", "domains": ["*"], "routes": routes,
                                                                       "include_attempt_count_in_response": True}]},
        # Lua before ext_proc: on the way back Envoy runs them in reverse, so the Lua
        # filter sees the headers only once the picker has released them, and its body
        # edits cannot reach a header block that is still held.
        # Off unless a route turns them on (the inference routes do): Envoy's own replies
        # to malformed requests, which match no route, never wait on the picker.
        # The answers filter after the picker's: on the way back it runs first. The request
        # guard between them: it sees the routing answer, and its own refusals (local replies
        # start at the filter that sends them) skip the answers filter.
        "http_filters": [{**lua_filter(), "disabled": True}, {**ext_proc_filter(config), "disabled": True},
                         {**guard_filter(), "disabled": True}, {**answers_filter(config), "disabled": True},
                         {"name": "envoy.filters.http.router",
                          "typed_config": {"@type": TYPE_URL + "envoy.extensions.filters.http.router.v3.Router"}}],
        "access_log": [access_log()],
        "local_reply_config": local_reply_config(limits.header_timeout_s, limits.body_timeout_s),
    }
    return {
        "node": {"id": f"taskplane-{door.port}", "cluster": "taskplane"},
        "admin": {"address": address("127.0.0.1", door.admin_port)},
        "overload_manager": {"resource_monitors": [{"name": "envoy.resource_monitors.global_downstream_max_connections",
                                                    "typed_config": {"@type": TYPE_URL + "envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                                                                     "max_active_downstream_connections": 50_000}}]},
        "static_resources": {
            "listeners": [{
                "name": "taskplane",
                "address": address(door.host, door.port),
                "per_connection_buffer_limit_bytes": limits.max_body_bytes,
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
            }],
            "clusters": [replica_cluster(door.endpoints_file), _static_cluster(EPP_CLUSTER, door.epp_port, http2=True),
                         _static_cluster(APP_CLUSTER, door.app_port, http2=False)],
        },
    }


def endpoint_of(url: str) -> str:
    """``ip:port`` of a replica URL, the GIE protocol's endpoint form (hostnames resolved)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.inet_aton(host)
        ip = host
    except OSError:
        ip = socket.gethostbyname(host)
    return f"{ip}:{port}"


def write_endpoints(path: Path, endpoints: list[str]) -> None:
    """Rewrite the replicas' EDS file atomically (write, then rename into the watched
    directory), so Envoy never reads half a file."""
    lb_endpoints = []
    for ep in sorted(set(endpoints)):
        host, _, port = ep.rpartition(":")
        lb_endpoints.append({"endpoint": {"address": address(host, int(port))}})
    doc = {"version_info": str(len(lb_endpoints)), "resources": [{
        "@type": TYPE_URL + "envoy.config.endpoint.v3.ClusterLoadAssignment",
        "cluster_name": REPLICA_CLUSTER,
        "endpoints": [{"lb_endpoints": lb_endpoints}],
    }]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
