"""The ext_proc messages the picker reads and writes, as small typed helpers.

Headers arrive as Envoy's ``HeaderMap`` (``raw_value`` bytes); the picker answers with
header mutations, body mutations, dynamic metadata (the GIE protocol's ``envoy.lb``
namespace) and ImmediateResponses that carry the contract's JSON error shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict

from taskplane.errors import TaskplaneError

EXT_PROC_ATTRS = "envoy.filters.http.ext_proc"


def header_pairs(headers: pb.HttpHeaders) -> list[tuple[str, str]]:
    """(name, value) pairs of an ext_proc header map, names lower-case as HTTP/2 sends them."""
    out = []
    for h in headers.headers.headers:
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        out.append((h.key.lower(), value))
    return out


class RequestHeaders(Mapping[str, str]):
    """A case-insensitive multi-map (with ``getlist``), the shape ``calls.intake`` reads:
    the strings Starlette's ``Headers`` would hold for the same bytes (the Python proxy's
    view, latin-1), found by one dict lookup instead of a scan of every header per name
    (intake asks for about thirty names per call)."""

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self._values: dict[str, list[str]] = {}
        for k, v in pairs:
            self._values.setdefault(_latin1(k, "replace").lower(), []).append(v)

    def __getitem__(self, key: str) -> str:
        return self._values[key.lower()][0]

    def get(self, key: str, default: Any = None) -> Any:
        values = self._values.get(key.lower())
        return values[0] if values else default

    def getlist(self, key: str) -> list[str]:
        return list(self._values.get(key.lower(), ()))

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def _latin1(text: str, errors: str) -> str:
    """``text`` as Starlette decodes its bytes (latin-1); ASCII, the usual case, as it is."""
    if text.isascii():
        return text
    if errors == "replace":
        return text.encode("latin-1", "replace").decode("latin-1")
    return text.encode("utf-8", "surrogateescape").decode("latin-1")


def as_headers(pairs: Iterable[tuple[str, str]]) -> RequestHeaders:
    """The request's headers as intake reads them (pseudo-headers left out). Envoy joins a
    repeated header with commas; a joined ``authorization`` (a bearer token has no comma)
    is split back, so two different keys are refused as the proxy refuses them."""
    out = []
    for k, v in pairs:
        if k.startswith(":"):
            continue
        values = [x.strip() for x in v.split(",")] if k == "authorization" and "," in v else [v]
        out += [(k, _latin1(x, "surrogateescape")) for x in values]
    return RequestHeaders(out)


def attribute(req: pb.ProcessingRequest, name: str) -> str | None:
    """One attribute Envoy attached (``response_attributes``), e.g. ``upstream.address``."""
    for key in (EXT_PROC_ATTRS, *req.attributes.keys()):
        s = req.attributes.get(key)
        if s is not None and name in s.fields:
            v = s.fields[name]
            return v.string_value or None
    return None


def attribute_headers(req: pb.ProcessingRequest) -> list[tuple[str, str]] | None:
    """The request's headers as a header message would carry them, from the attributes
    Envoy sends with the body when the routing filter skips the headers
    (``envoy_names.REQUEST_ATTRIBUTES``: ``:method``, ``:path`` and each header by name).
    A repeated header comes joined with commas; a taskplane header's value is split back
    into its parts, so two different values are refused as from a header message (a single
    value with a comma then counts as repeated). A value that is not ASCII is read as the
    header message's ``raw_value`` is (``lua.attribute_safe_lua`` sent its bytes as code
    points). None: no such attributes came (the headers came as a message of their own)."""
    attrs = req.attributes.get(EXT_PROC_ATTRS)
    if attrs is None or "request.method" not in attrs.fields:
        return None
    fields = attrs.fields
    pairs = [(":method", fields["request.method"].string_value),
             (":path", fields["request.path"].string_value if "request.path" in fields else "")]
    for key, value in fields.items():
        if key.startswith(_HEADER_ATTR) and (v := value.string_value):
            name = key[len(_HEADER_ATTR):-2]
            if not v.isascii():  # the Lua filter sent each byte >= 0x80 as its code point: the bytes back
                v = v.encode("latin-1", "replace").decode("utf-8", "replace")
            parts = v.split(",") if "," in v and name.startswith("x-taskplane-") else [v]
            pairs += [(name, x.strip()) for x in parts]
    return pairs


_HEADER_ATTR = "request.headers['"


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


_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def fill_headers(mutation: pb.HeaderMutation, set_headers: Mapping[str, str] | None = None, remove: Iterable[str] = ()) -> None:
    """Add headers to set (overwriting) and to remove to ``mutation``, in place: a message
    per header built and then copied in cost about twice as much (several per call)."""
    mutation.remove_headers.extend(remove)
    for key, value in (set_headers or {}).items():
        option = mutation.set_headers.add()
        option.append_action = _OVERWRITE
        option.header.key = key
        option.header.raw_value = value.encode()


def header_mutation(set_headers: Mapping[str, str] | None = None, remove: Iterable[str] = ()) -> pb.HeaderMutation:
    """Headers to set (overwriting) and to remove, as a message of its own."""
    mutation = pb.HeaderMutation()
    fill_headers(mutation, set_headers, remove)
    return mutation


def fill_struct(target: struct_pb2.Struct, value: Mapping[str, Any]) -> None:
    """``value`` (nested mappings of strings, booleans, numbers, None) written into ``target``
    field by field; ``Struct.update``'s pure-Python walk cost three times as much."""
    fields = target.fields
    for key, v in value.items():
        if isinstance(v, str):
            fields[key].string_value = v
        elif isinstance(v, bool):
            fields[key].bool_value = v
        elif isinstance(v, int | float):
            fields[key].number_value = v
        elif isinstance(v, Mapping):
            fill_struct(fields[key].struct_value, v)
        elif v is None:
            fields[key].null_value = struct_pb2.NULL_VALUE
        else:  # lists: the generic path
            target.update({key: v})


def struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    fill_struct(s, value)
    return s


def answer(phase: str, *, headers: Mapping[str, str] | None = None, remove: Iterable[str] = (), body: bytes | None = None,
           streamed: tuple[bytes, bool] | None = None, metadata: Mapping[str, Any] | None = None) -> pb.ProcessingResponse:
    """The answer to one ext_proc message of ``phase`` (``request_headers``, ``request_body``,
    ``response_headers``, ``response_body``), built in place: nested messages made first and
    then copied in cost two to three times as much, three answers per call.
    ``headers`` (even empty) sets a header mutation, ``remove`` drops headers with it;
    ``body`` replaces a buffered body, ``streamed`` (bytes, end_of_stream) answers a
    streamed chunk; ``metadata``: dynamic metadata to emit."""
    resp = pb.ProcessingResponse()
    part = getattr(resp, phase)
    part.SetInParent()
    if headers is not None or body is not None or streamed is not None:
        common = part.response
        if headers is not None:
            mutation = common.header_mutation
            mutation.SetInParent()
            fill_headers(mutation, headers, remove)
        if body is not None:
            common.body_mutation.body = body
        elif streamed is not None:
            chunk = common.body_mutation.streamed_response
            chunk.body, chunk.end_of_stream = streamed
    if metadata is not None:
        fill_struct(resp.dynamic_metadata, metadata)
    return resp


def immediate(status: int, body: bytes, headers: Mapping[str, str] | None = None, details: str = "") -> pb.ProcessingResponse:
    resp = pb.ProcessingResponse()
    reply = resp.immediate_response
    reply.status.code = status  # type: ignore[assignment]
    reply.headers.SetInParent()
    fill_headers(reply.headers, headers)
    reply.body = body
    reply.details = details.replace(" ", "_")[:64]
    return resp


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
