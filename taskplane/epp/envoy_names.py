"""The names taskplane's Envoy bootstrap (``envoy_config``), its Lua filters (``lua``) and
the picker agree on: clusters, headers, metadata namespaces, the request attributes of
the one-message exchange; and the two units Envoy's config is written in."""

from __future__ import annotations

from typing import Any

from taskplane.calls.openai_extra import PATHS
from taskplane.context import CALL_HEADERS

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
#: Envoy's retries at most (the picker lists the choice and up to this many fallbacks, and
#: lowers it per call with ``x-envoy-max-retries`` when it has fewer).
NUM_RETRIES = 2
MAX_RETRIES_HEADER = "x-envoy-max-retries"

TYPE_URL = "type.googleapis.com/"


def address(host: str, port: int) -> dict[str, Any]:
    """A socket address in Envoy's terms."""
    return {"socket_address": {"address": host, "port_value": port}}


def duration(seconds: float) -> str:
    """A duration in Envoy's terms (``"1.500s"``)."""
    return f"{seconds:.3f}s"


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
