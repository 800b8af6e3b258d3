"""The HTTP filters of taskplane's Envoy: the picker's two ext_proc filters (the routing
one, and ``taskplane.answers`` for every answer but a successful stream), the Lua usage
scan and request guard (``lua``), the gRPC access log, and how an inference route turns
each of them on (off by default: Envoy's own replies never wait on the picker)."""

from __future__ import annotations

from typing import Any

from taskplane.config import GatewayConfig
from taskplane.epp.envoy_names import (
    ALS_LOG_NAME,
    ANSWERS_FILTER,
    ATTRIBUTE_HEADERS,
    ENDPOINTS_NAMESPACE,
    EPP_CLUSTER,
    EXCHANGE_HEADER,
    GUARD_FILTER,
    LB_NAMESPACE,
    NUM_RETRIES,
    REQUEST_ATTRIBUTES,
    REQUEST_NAMESPACE,
    TP_NAMESPACE,
    TYPE_URL,
    duration,
)
from taskplane.epp.lua import GUARD_LUA, attribute_safe_lua
from taskplane.epp.timers import CallTimers


def _ext_proc(config: GatewayConfig, mode: dict[str, str], exchange: str | None) -> dict[str, Any]:
    hold = call_timers(config).picker_s
    grpc_service: dict[str, Any] = {"envoy_grpc": {"cluster_name": EPP_CLUSTER}, "timeout": duration(hold)}
    if exchange is not None:
        grpc_service["initial_metadata"] = [{"key": EXCHANGE_HEADER, "value": exchange}]
    return {
        "@type": TYPE_URL + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": grpc_service,
        "failure_mode_allow": False,
        "status_on_error": {"code": 503},
        "message_timeout": duration(hold),
        "max_message_timeout": duration(hold),
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
    return {"name": header, "typed_config": {"@type": TYPE_URL + "envoy.type.matcher.v3.HttpResponseHeaderMatchInput",
                                             "header_name": header}}


SKIP_STREAMS = {"matcher_list": {"matchers": [{
    "predicate": {"and_matcher": {"predicate": [
        {"single_predicate": {"input": _response_input(":status"), "value_match": {"exact": "200"}}},
        {"single_predicate": {"input": _response_input("content-type"), "value_match": {"prefix": "text/event-stream"}}},
    ]}},
    "on_match": {"action": {"name": "skip", "typed_config": {
        "@type": TYPE_URL + "envoy.extensions.filters.common.matcher.action.v3.SkipFilter"}}},
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
        "@type": TYPE_URL + "envoy.extensions.common.matching.v3.ExtensionWithMatcher",
        "extension_config": {"name": ANSWERS_FILTER, "typed_config": _ext_proc(config, mode, "answers")},
        "xds_matcher": SKIP_STREAMS,
    }}


def lua_filter() -> dict[str, Any]:
    return {"name": "envoy.filters.http.lua", "typed_config": {
        "@type": TYPE_URL + "envoy.extensions.filters.http.lua.v3.Lua",
        # the usage scan, with the attribute headers made valid UTF-8 for the picker's message
        "source_codes": {"usage": {"inline_string": attribute_safe_lua(ATTRIBUTE_HEADERS)}},
    }}


def guard_filter() -> dict[str, Any]:
    """The one-message exchange's request guard (``GUARD_FILTER``, ``epp.lua``)."""
    return {"name": GUARD_FILTER, "typed_config": {
        "@type": TYPE_URL + "envoy.extensions.filters.http.lua.v3.Lua",
        "source_codes": {"guard": {"inline_string": GUARD_LUA}},
    }}


def access_log(epp_cluster: str = EPP_CLUSTER) -> dict[str, Any]:
    """One gRPC access-log entry per inference call, carrying taskplane's dynamic metadata
    (the attempt's id, the stream's usage): how a stream's row gets its numbers."""
    return {"name": "envoy.access_loggers.http_grpc", "filter": {"metadata_filter": {
        "matcher": {"filter": TP_NAMESPACE, "path": [{"key": "call"}], "value": {"present_match": True}},
    }}, "typed_config": {
        "@type": TYPE_URL + "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
        "common_config": {"log_name": ALS_LOG_NAME, "transport_api_version": "V3",
                          "grpc_service": {"envoy_grpc": {"cluster_name": epp_cluster}},
                          "buffer_flush_interval": "0.05s", "buffer_size_bytes": 16384},
    }}


def _enabled(config: dict[str, Any]) -> dict[str, Any]:
    return {"@type": TYPE_URL + "envoy.config.route.v3.FilterConfig", "disabled": False, "config": config}


EXT_PROC_ON = _enabled({"@type": TYPE_URL + "envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute", "overrides": {}})
LUA_ON = _enabled({"@type": TYPE_URL + "envoy.extensions.filters.http.lua.v3.LuaPerRoute", "name": "usage"})
GUARD_ON = _enabled({"@type": TYPE_URL + "envoy.extensions.filters.http.lua.v3.LuaPerRoute", "name": "guard"})
ANSWERS_ON = _enabled({"@type": TYPE_URL + "envoy.extensions.common.matching.v3.ExtensionWithMatcherPerRoute",
                        "xds_matcher": SKIP_STREAMS})


def call_timers(config: GatewayConfig) -> CallTimers:
    """The inference routes' timers (``epp.timers``): per try, the picker, the stream."""
    return CallTimers.of(config, tries=NUM_RETRIES + 1)

