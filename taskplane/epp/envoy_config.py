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
contract's JSON error shape.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskplane.calls.openai_extra import PATHS
from taskplane.config import GatewayConfig
from taskplane.context import CALL_HEADERS
from taskplane.engines.keepalive import REPLICA_IDLE_S
from taskplane.epp.deadlines import DETAILS as BODY_TIMEOUT_DETAILS
from taskplane.epp.lua import GUARD_LUA, attribute_safe_lua
from taskplane.epp.timers import BACKOFF_BASE_S, BACKOFF_MAX_S, CallTimers

#: The inference paths the picker decides (kind per path, as ``calls.intake`` names them).
INFERENCE_PATHS: dict[str, str] = {path: kind for kind, path in PATHS.items()}
EPP_CLUSTER = "taskplane_epp"
REPLICA_CLUSTER = "taskplane_replicas"
APP_CLUSTER = "taskplane_app"
ALS_LOG_NAME = "taskplane"
DEST_HEADER = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
#: The namespace of taskplane's own dynamic metadata (the attempt's id, the Lua usage).
TP_NAMESPACE = "taskplane"
_BIG = 1_000_000  # circuit-breaker limits: admission is taskplane's job, not Envoy's
#: Envoy's retries at most (the picker lists the choice and up to this many fallbacks, and
#: lowers it per call with ``x-envoy-max-retries`` when it has fewer).
NUM_RETRIES = 2
MAX_RETRIES_HEADER = "x-envoy-max-retries"

_T = "type.googleapis.com/"


@dataclass(frozen=True)
class FrontDoor:
    """Where each part listens: clients on ``host:port``, the picker, the Python app, Envoy's admin."""

    host: str
    port: int
    epp_port: int
    app_port: int
    admin_port: int
    endpoints_file: Path


def _addr(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _dur(seconds: float) -> str:
    return f"{seconds:.3f}s"


def _static_cluster(name: str, port: int, *, http2: bool) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _addr("127.0.0.1", port)}}]}]},
        "circuit_breakers": {"thresholds": [_thresholds()]},
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _T + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
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
            "@type": _T + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "common_http_protocol_options": {"idle_timeout": _dur(REPLICA_IDLE_S)},
            "explicit_http_config": {"http_protocol_options": {}},
        }},
        "load_balancing_policy": {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.override_host",
            "typed_config": {
                "@type": _T + "envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                "override_host_sources": [{"header": DEST_HEADER},
                                          {"metadata": {"key": LB_NAMESPACE, "path": [{"key": DEST_HEADER}]}}],
                "fallback_policy": {"policies": [{"typed_extension_config": {
                    "name": "envoy.load_balancing_policies.round_robin",
                    "typed_config": {"@type": _T + "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"},
                }}]},
            },
        }}]},
    }


#: How a call reaches the picker: one ext_proc message, the request body, with the request's
#: method, path and headers as attributes (``REQUEST_ATTRIBUTES``); a successful stream's
#: answer passes Envoy with no picker message (its headers from the Lua filter, its row from
#: the access log), every other answer goes to the answers filter. With the request headers
#: skipped the picker hears of a call only once its body is whole, so Envoy keeps the body
#: deadline itself: see ``UPLOADED_KEY``.
#: The body deadline: each inference path has two routes. The one a request
#: matches at first limits the stream to ``limits.body_timeout_s`` from its first byte
#: (``max_stream_duration``: 408 when the request is not whole); the usage Lua filter, before
#: the routing filter, marks ``taskplane.uploaded`` once the body is whole and clears the
#: route cache, so the second route (matched on that metadata, no duration limit) applies
#: before the picker holds the call for admission. (Envoy re-arms a route's duration timer
#: when the route is chosen again, and disarms it for a route that has none.)
UPLOADED_KEY = "uploaded"
#: Envoy's response code details of the duration limit (mapped to the body deadline's words).
DURATION_DETAILS = "max_duration_timeout"
#: What the routing filter sends with the body (its request headers are SKIP):
#: the picker builds the call from these exactly as from a headers message (``epp.protocol``).
#: (Envoy 1.40 sends the whole ``request.headers`` map as an empty struct, so each header is
#: named; a repeated header comes joined with commas.)
ATTRIBUTE_HEADERS = ("authorization", *CALL_HEADERS)
REQUEST_ATTRIBUTES = ["request.method", "request.path", *(f"request.headers['{name}']" for name in ATTRIBUTE_HEADERS)]
#: The Lua filter after the routing one: refuses what the picker never routed
#: (a body-less request sends it no message) and strips the client's taskplane, ``x-envoy-*``
#: and ``authorization`` headers the picker did not see (``epp.lua``).
GUARD_FILTER = "taskplane.request_guard"
#: The dynamic-metadata namespace of the request headers the routing answer sets (the
#: destination, Envoy's retry count): with the headers skipped, Envoy has let them on before
#: the body's answer and applies none of its header mutation, so the request guard sets these.
REQUEST_NAMESPACE = "taskplane.request"
#: The gRPC header (ext_proc ``initial_metadata``) by which taskplane's own Envoy tells the
#: picker which of its two filters an ext_proc stream comes from: ``route`` (the request
#: phases only: the answer needs no message of its own) or ``answers`` (the response phases
#: of an answer that is not a successful stream). A stream without it is a GIE-style filter.
EXCHANGE_HEADER = "x-taskplane-exchange"
ANSWERS_FILTER = "taskplane.answers"
#: The route's response header naming the endpoint that answered (``%UPSTREAM_REMOTE_ADDRESS%``);
#: the Lua filter reads and removes it (``epp.lua``).
UPSTREAM_HEADER = "x-taskplane-upstream"
#: The dynamic-metadata namespace holding, per listed endpoint (``ip:port``), the headers
#: its answer carries (read by the Lua filter; a namespace of its own, so neither the access
#: log's reader nor the answers filter's messages carry it into Python).
ENDPOINTS_NAMESPACE = "taskplane.endpoints"


def _ext_proc(config: GatewayConfig, mode: dict[str, str], exchange: str | None) -> dict[str, Any]:
    hold = call_timers(config).picker_s
    grpc_service: dict[str, Any] = {"envoy_grpc": {"cluster_name": EPP_CLUSTER}, "timeout": _dur(hold)}
    if exchange is not None:
        grpc_service["initial_metadata"] = [{"key": EXCHANGE_HEADER, "value": exchange}]
    return {
        "@type": _T + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": grpc_service,
        "failure_mode_allow": False,
        "status_on_error": {"code": 503},
        "message_timeout": _dur(hold),
        "max_message_timeout": _dur(hold),
        "allow_mode_override": True,
        # the picker sets x-envoy-max-retries per call (its list's length) and strips the
        # client's x-envoy-* headers; every other default stays (no routing headers)
        "mutation_rules": {"allow_envoy": True},
        "processing_mode": mode,
        # who answered, and why Envoy answered itself (its per-try timeout: a hung replica)
        "response_attributes": ["upstream.address", "response.code_details"],
        # the answers filter finds its call by the key the routing answer put in ``taskplane``
        "metadata_options": {"forwarding_namespaces": {"untyped": [LB_NAMESPACE, TP_NAMESPACE] if exchange == "answers"
                                                       else [LB_NAMESPACE]},
                             "receiving_namespaces": {"untyped": [LB_NAMESPACE, TP_NAMESPACE, ENDPOINTS_NAMESPACE,
                                                                   REQUEST_NAMESPACE]}},
    }


def ext_proc_filter(config: GatewayConfig) -> dict[str, Any]:
    """The request, buffered, to the picker. A call held by admission (or for an empty pool)
    waits inside the picker, so the message timeout covers the longest hold (``epp.timers``).
    One message, the body, with the request's method, path and headers as attributes
    (``REQUEST_ATTRIBUTES``; a body-less request never reaches the picker, the request guard
    refuses it); the answer goes to the answers filter (``answers_filter``), or, a successful
    stream, to no filter at all."""
    mode = {
        "request_header_mode": "SKIP",
        "request_body_mode": "BUFFERED",
        "request_trailer_mode": "SKIP",
        "response_header_mode": "SKIP",
        "response_body_mode": "NONE",
        "response_trailer_mode": "SKIP",
    }
    typed = _ext_proc(config, mode, "route")
    typed["request_attributes"] = list(REQUEST_ATTRIBUTES)
    return {"name": "envoy.filters.http.ext_proc", "typed_config": typed}


def _response_input(header: str) -> dict[str, Any]:
    return {"name": header, "typed_config": {"@type": _T + "envoy.type.matcher.v3.HttpResponseHeaderMatchInput",
                                             "header_name": header}}


_SKIP_STREAMS = {"matcher_list": {"matchers": [{
    "predicate": {"and_matcher": {"predicate": [
        {"single_predicate": {"input": _response_input(":status"), "value_match": {"exact": "200"}}},
        {"single_predicate": {"input": _response_input("content-type"), "value_match": {"prefix": "text/event-stream"}}},
    ]}},
    "on_match": {"action": {"name": "skip", "typed_config": {
        "@type": _T + "envoy.extensions.filters.common.matcher.action.v3.SkipFilter"}}},
}]}}


def answers_filter(config: GatewayConfig) -> dict[str, Any]:
    """The picker's second ext_proc filter: response headers (and the body, as the picker
    asks with ``mode_override``) of every answer but a successful stream, which the
    matcher skips (status 200, ``text/event-stream``): that one's headers come from the
    Lua filter and its row from the access log. Unary answers (usage from the body, the
    response cache) and error answers (the contract's JSON error, retries exhausted)
    still reach the picker here, on an ext_proc stream of their own."""
    mode = {"request_header_mode": "SKIP", "request_body_mode": "NONE", "request_trailer_mode": "SKIP",
            "response_header_mode": "SEND", "response_body_mode": "NONE", "response_trailer_mode": "SKIP"}
    return {"name": ANSWERS_FILTER, "typed_config": {
        "@type": _T + "envoy.extensions.common.matching.v3.ExtensionWithMatcher",
        "extension_config": {"name": ANSWERS_FILTER, "typed_config": _ext_proc(config, mode, "answers")},
        "xds_matcher": _SKIP_STREAMS,
    }}


def lua_filter() -> dict[str, Any]:
    return {"name": "envoy.filters.http.lua", "typed_config": {
        "@type": _T + "envoy.extensions.filters.http.lua.v3.Lua",
        # the usage scan, with the attribute headers made valid UTF-8 for the picker's message
        "source_codes": {"usage": {"inline_string": attribute_safe_lua(ATTRIBUTE_HEADERS)}},
    }}


def guard_filter() -> dict[str, Any]:
    """The one-message exchange's request guard (``GUARD_FILTER``, ``epp.lua``)."""
    return {"name": GUARD_FILTER, "typed_config": {
        "@type": _T + "envoy.extensions.filters.http.lua.v3.Lua",
        "source_codes": {"guard": {"inline_string": GUARD_LUA}},
    }}


def access_log(epp_cluster: str = EPP_CLUSTER) -> dict[str, Any]:
    """One gRPC access-log entry per inference call, carrying taskplane's dynamic metadata
    (the attempt's id, the stream's usage): how a stream's row gets its numbers."""
    return {"name": "envoy.access_loggers.http_grpc", "filter": {"metadata_filter": {
        "matcher": {"filter": TP_NAMESPACE, "path": [{"key": "call"}], "value": {"present_match": True}},
    }}, "typed_config": {
        "@type": _T + "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
        "common_config": {"log_name": ALS_LOG_NAME, "transport_api_version": "V3",
                          "grpc_service": {"envoy_grpc": {"cluster_name": epp_cluster}},
                          "buffer_flush_interval": "0.05s", "buffer_size_bytes": 16384},
    }}


def _enabled(config: dict[str, Any]) -> dict[str, Any]:
    return {"@type": _T + "envoy.config.route.v3.FilterConfig", "disabled": False, "config": config}


_EXT_PROC_ON = _enabled({"@type": _T + "envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute", "overrides": {}})
_LUA_ON = _enabled({"@type": _T + "envoy.extensions.filters.http.lua.v3.LuaPerRoute", "name": "usage"})
_GUARD_ON = _enabled({"@type": _T + "envoy.extensions.filters.http.lua.v3.LuaPerRoute", "name": "guard"})
_ANSWERS_ON = _enabled({"@type": _T + "envoy.extensions.common.matching.v3.ExtensionWithMatcherPerRoute",
                        "xds_matcher": _SKIP_STREAMS})


def call_timers(config: GatewayConfig) -> CallTimers:
    """The inference routes' timers (``epp.timers``): per try, the picker, the stream."""
    return CallTimers.of(config, tries=NUM_RETRIES + 1)


def _inference_routes(path: str, config: GatewayConfig) -> list[dict[str, Any]]:
    """The routes of one inference path: the uploaded one (matched on ``taskplane.uploaded``,
    no duration limit) before the uploading one (``UPLOADED_KEY``)."""
    route = _inference_route(path, config)
    uploaded = {**route, "match": {**route["match"], "dynamic_metadata": [
        {"filter": TP_NAMESPACE, "path": [{"key": UPLOADED_KEY}], "value": {"present_match": True}}]},
        "route": {**route["route"], "max_stream_duration": {"max_stream_duration": "0s"}}}
    uploading = {**route, "route": {**route["route"], "max_stream_duration": {
        "max_stream_duration": _dur(config.limits.body_timeout_s)}}}
    return [uploaded, uploading]


def _inference_route(path: str, config: GatewayConfig) -> dict[str, Any]:
    timers = call_timers(config)
    # the picker, the Lua scan, the guard and the answers filter are off by default (see
    # ``bootstrap``) and on here
    filters = {"envoy.filters.http.ext_proc": _EXT_PROC_ON, "envoy.filters.http.lua": _LUA_ON,
               GUARD_FILTER: _GUARD_ON, ANSWERS_FILTER: _ANSWERS_ON}
    # who answered, for the Lua filter to add that endpoint's headers (it removes this one)
    extra = {"response_headers_to_add": [{"header": {"key": UPSTREAM_HEADER, "value": "%UPSTREAM_REMOTE_ADDRESS%"},
                                          "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]}
    return {
        "typed_per_filter_config": filters,
        **extra,
        "match": {"path": path, "headers": [{"name": ":method", "string_match": {"exact": "POST"}}]},
        "route": {
            "cluster": REPLICA_CLUSTER,
            "timeout": "0s",  # a stream lasts as long as it lasts; idle limits guard hangs
            # longer than the picker's hold and every try together: never cuts in on a retry
            "idle_timeout": _dur(timers.stream_idle_s),
            "retry_policy": {
                # before anything reached the client: refused, reset, 5xx/429 from the engine,
                # or silent for the call's limit (the per-try timeout answers 504: gateway-error)
                "retry_on": "connect-failure,refused-stream,reset-before-request,gateway-error,retriable-status-codes",
                "retriable_status_codes": [429, 500, 503],
                "num_retries": NUM_RETRIES,
                "per_try_idle_timeout": _dur(timers.per_try_idle_s),
                "retry_back_off": {"base_interval": _dur(BACKOFF_BASE_S), "max_interval": _dur(BACKOFF_MAX_S)},
            },
        },
    }


def _app_route(prefix: str) -> dict[str, Any]:
    return {"match": {"prefix": prefix}, "route": {"cluster": APP_CLUSTER, "timeout": "120s"}}


def _error_mapper(flags: str, status: int, error_type: str, message: str) -> dict[str, Any]:
    return {
        "filter": {"response_flag_filter": {"flags": flags.split(",")}},
        "status_code": status,
        "body_format_override": {"json_format": {"error": {"type": error_type, "message": message}},
                                 "content_type": "application/json"},
    }


def _cel_mapper(expression: str, message: str, error_type: str = "invalid_request") -> dict[str, Any]:
    return {
        "filter": {"extension_filter": {"name": "envoy.access_loggers.extension_filters.cel", "typed_config": {
            "@type": _T + "envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter", "expression": expression}}},
        "body_format_override": {"json_format": {"error": {"type": error_type, "message": message}},
                                 "content_type": "application/json"},
    }


def local_reply_config(header_timeout_s: float = 10.0, body_timeout_s: float = 30.0) -> dict[str, Any]:
    """Envoy's own replies in the contract's ``{"error": {"type", "message"}}`` shape (the
    header deadline's in the Python proxy's words). The picker's ImmediateResponses already
    carry that shape and no response flag, so the mappers match on Envoy's flags only and
    leave them untouched."""
    return {"mappers": [
        _error_mapper("UH,UF,URX,UO,NC", 503, "no_replica", "no replica answered: %RESPONSE_CODE_DETAILS%"),
        _error_mapper("UT,UC,UR,UMSDR", 502, "replica_error", "replica failed: %RESPONSE_CODE_DETAILS%"),
        _error_mapper("NR", 404, "invalid_request", "no route for this path"),
        _error_mapper("DPE", 400, "invalid_request", "malformed request: %RESPONSE_CODE_DETAILS%"),
        _error_mapper("UPE", 502, "replica_error", "the replica at %UPSTREAM_HOST% broke the HTTP protocol: %RESPONSE_CODE_DETAILS%"),
        # the HTTP/1 codec's refusals (bad request line, header characters, content-length)
        _cel_mapper("response.code_details.startsWith('http1.') && response.code < 413",
                    "malformed HTTP request: %RESPONSE_CODE_DETAILS%"),
        {"filter": {"status_code_filter": {"comparison": {"op": "EQ", "value": {"default_value": 413, "runtime_key": "tp_413"}}}},
         "body_format_override": {"json_format": {"error": {"type": "payload_too_large", "message": "request body exceeds the limit"}},
                                  "content_type": "application/json"}},
        _cel_mapper("response.code == 408 && response.code_details == 'request_header_timeout'",
                    f"request headers not received within {header_timeout_s:g} s"),
        # the upload's duration limit (``UPLOADED_KEY``): the body deadline, in the picker's words
        _cel_mapper(f"response.code == 408 && response.code_details == '{DURATION_DETAILS}'",
                    f"request body not received within {body_timeout_s:g} s"),
        # the picker's own 408 (the body deadline, ``epp.deadlines``) already says it in the contract's words
        _cel_mapper(f"response.code == 408 && response.code_details != '{BODY_TIMEOUT_DETAILS}'",
                    "request body not received within the time limit (%RESPONSE_CODE_DETAILS%)"),
        {"filter": {"status_code_filter": {"comparison": {"op": "EQ", "value": {"default_value": 431, "runtime_key": "tp_431"}}}},
         "body_format_override": {"json_format": {"error": {"type": "invalid_request", "message": "request header block exceeds the 64 KiB limit"}},
                                  "content_type": "application/json"}},
    ]}


def bootstrap(config: GatewayConfig, door: FrontDoor) -> dict[str, Any]:
    """The whole Envoy bootstrap for one front door (the exchange: ``ext_proc_filter``)."""
    limits = config.limits
    routes = [r for p in INFERENCE_PATHS for r in _inference_routes(p, config)] + [_app_route("/")]
    hcm = {
        "@type": _T + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "taskplane",
        "codec_type": "AUTO",
        "request_headers_timeout": _dur(limits.header_timeout_s),
        "stream_idle_timeout": _dur(limits.request_timeout_s),  # the app's routes; the inference routes set their own
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
                          "typed_config": {"@type": _T + "envoy.extensions.filters.http.router.v3.Router"}}],
        "access_log": [access_log()],
        "local_reply_config": local_reply_config(limits.header_timeout_s, limits.body_timeout_s),
    }
    return {
        "node": {"id": f"taskplane-{door.port}", "cluster": "taskplane"},
        "admin": {"address": _addr("127.0.0.1", door.admin_port)},
        "overload_manager": {"resource_monitors": [{"name": "envoy.resource_monitors.global_downstream_max_connections",
                                                    "typed_config": {"@type": _T + "envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                                                                     "max_active_downstream_connections": 50_000}}]},
        "static_resources": {
            "listeners": [{
                "name": "taskplane",
                "address": _addr(door.host, door.port),
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
        lb_endpoints.append({"endpoint": {"address": _addr(host, int(port))}})
    doc = {"version_info": str(len(lb_endpoints)), "resources": [{
        "@type": _T + "envoy.config.endpoint.v3.ClusterLoadAssignment",
        "cluster_name": REPLICA_CLUSTER,
        "endpoints": [{"lb_endpoints": lb_endpoints}],
    }]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
