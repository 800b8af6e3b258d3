"""The routes of taskplane's Envoy: per inference path, its two routes (uploading, with the
body deadline, and uploaded) to the replica the picker names, with Envoy's retries and
timers; everything else to the HTTP app; and Envoy's own replies in the contract's JSON
error shape."""

from __future__ import annotations

from typing import Any

from taskplane.config import GatewayConfig
from taskplane.epp.deadlines import DETAILS as BODY_TIMEOUT_DETAILS
from taskplane.epp.envoy_filters import ANSWERS_ON, EXT_PROC_ON, GUARD_ON, LUA_ON, call_timers
from taskplane.epp.envoy_names import (
    ANSWERS_FILTER,
    APP_CLUSTER,
    DURATION_DETAILS,
    GUARD_FILTER,
    NUM_RETRIES,
    REPLICA_CLUSTER,
    TP_NAMESPACE,
    TYPE_URL,
    UPLOADED_KEY,
    UPSTREAM_HEADER,
    duration,
)
from taskplane.epp.timers import BACKOFF_BASE_S, BACKOFF_MAX_S


def inference_routes(path: str, config: GatewayConfig) -> list[dict[str, Any]]:
    """The routes of one inference path: the uploaded one (matched on ``taskplane.uploaded``,
    no duration limit) before the uploading one (``UPLOADED_KEY``)."""
    route = _inference_route(path, config)
    uploaded = {**route, "match": {**route["match"], "dynamic_metadata": [
        {"filter": TP_NAMESPACE, "path": [{"key": UPLOADED_KEY}], "value": {"present_match": True}}]},
        "route": {**route["route"], "max_stream_duration": {"max_stream_duration": "0s"}}}
    uploading = {**route, "route": {**route["route"], "max_stream_duration": {
        "max_stream_duration": duration(config.limits.body_timeout_s)}}}
    return [uploaded, uploading]


def _inference_route(path: str, config: GatewayConfig) -> dict[str, Any]:
    timers = call_timers(config)
    # the picker, the Lua scan, the guard and the answers filter are off by default (see
    # ``bootstrap``) and on here
    filters = {"envoy.filters.http.ext_proc": EXT_PROC_ON, "envoy.filters.http.lua": LUA_ON,
               GUARD_FILTER: GUARD_ON, ANSWERS_FILTER: ANSWERS_ON}
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
            "idle_timeout": duration(timers.stream_idle_s),
            "retry_policy": {
                # before anything reached the client: refused, reset, 5xx/429 from the engine,
                # or silent for the call's limit (the per-try timeout answers 504: gateway-error)
                "retry_on": "connect-failure,refused-stream,reset-before-request,gateway-error,retriable-status-codes",
                "retriable_status_codes": [429, 500, 503],
                "num_retries": NUM_RETRIES,
                "per_try_idle_timeout": duration(timers.per_try_idle_s),
                "retry_back_off": {"base_interval": duration(BACKOFF_BASE_S), "max_interval": duration(BACKOFF_MAX_S)},
            },
        },
    }


def app_route(prefix: str) -> dict[str, Any]:
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
            "@type": TYPE_URL + "envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter", "expression": expression}}},
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

