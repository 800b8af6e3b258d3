"""The ext_proc messages the picker reads and writes, as small typed helpers.

Headers arrive as Envoy's ``HeaderMap`` (``raw_value`` bytes); the picker answers with
header mutations, body mutations, dynamic metadata (the GIE protocol's ``envoy.lb``
namespace) and ImmediateResponses that carry the contract's JSON error shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict
from starlette.datastructures import Headers

from taskplane.errors import TaskplaneError

EXT_PROC_ATTRS = "envoy.filters.http.ext_proc"


def header_pairs(headers: pb.HttpHeaders) -> list[tuple[str, str]]:
    """(name, value) pairs of an ext_proc header map, names lower-case as HTTP/2 sends them."""
    out = []
    for h in headers.headers.headers:
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        out.append((h.key.lower(), value))
    return out


def as_headers(pairs: Iterable[tuple[str, str]]) -> Headers:
    """A case-insensitive multi-map (with ``getlist``), the shape ``gateway.intake`` reads.
    Envoy joins a repeated header with commas; a joined ``authorization`` (a bearer token
    has no comma) is split back, so two different keys are refused as the proxy refuses them."""
    raw = []
    for k, v in pairs:
        if k.startswith(":"):
            continue
        values = [x.strip() for x in v.split(",")] if k == "authorization" and "," in v else [v]
        raw += [(k.encode("latin-1", "replace"), x.encode("utf-8", "surrogateescape")) for x in values]
    return Headers(raw=raw)


def attribute(req: pb.ProcessingRequest, name: str) -> str | None:
    """One attribute Envoy attached (``response_attributes``), e.g. ``upstream.address``."""
    for key in (EXT_PROC_ATTRS, *req.attributes.keys()):
        s = req.attributes.get(key)
        if s is not None and name in s.fields:
            v = s.fields[name]
            return v.string_value or None
    return None


def plain(value: struct_pb2.Value) -> Any:
    """One protobuf ``Value`` as plain Python (numbers are floats, as JSON has them)."""
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        return value.number_value
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind is None or kind == "null_value":
        return None
    return MessageToDict(value)


def struct_dict(s: struct_pb2.Struct) -> dict[str, Any]:
    """A flat ``Struct`` (dynamic metadata) as a dict, without ``MessageToDict``'s generic
    walk: it was a tenth of the access log's cost per streamed call."""
    return {k: plain(v) for k, v in s.fields.items()}


def metadata_value(req: pb.ProcessingRequest, namespace: str, key: str) -> Any:
    """A value Envoy forwarded from dynamic metadata (``metadata_context``), or None."""
    s = req.metadata_context.filter_metadata.get(namespace)
    if s is None or key not in s.fields:
        return None
    return plain(s.fields[key])


def _option(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
                                      append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)


def header_mutation(set_headers: Mapping[str, str] | None = None, remove: Iterable[str] = ()) -> pb.HeaderMutation:
    return pb.HeaderMutation(set_headers=[_option(k, v) for k, v in (set_headers or {}).items()], remove_headers=list(remove))


def struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(dict(value))
    return s


def immediate(status: int, body: bytes, headers: Mapping[str, str] | None = None, details: str = "") -> pb.ProcessingResponse:
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),  # type: ignore[arg-type]
        headers=header_mutation(headers),
        body=body,
        details=details.replace(" ", "_")[:64],
    ))


def error_reply(exc: TaskplaneError) -> pb.ProcessingResponse:
    """The contract's error (``{"error": {"type", "message"}}``) as an ImmediateResponse,
    with Retry-After when shed, exactly as the Python gateway answers it."""
    headers = {"content-type": "application/json"}
    if exc.retry_after_s is not None:
        headers["retry-after"] = str(max(1, round(exc.retry_after_s)))
    return immediate(exc.status, json.dumps(exc.body()).encode(), headers, details=f"taskplane_{exc.error_type}")


def json_reply(status: int, data: Any, headers: Mapping[str, str]) -> pb.ProcessingResponse:
    return immediate(status, json.dumps(data).encode(), {"content-type": "application/json", **headers})


def common(*, headers: pb.HeaderMutation | None = None, body: pb.BodyMutation | None = None) -> pb.CommonResponse:
    return pb.CommonResponse(header_mutation=headers, body_mutation=body)
