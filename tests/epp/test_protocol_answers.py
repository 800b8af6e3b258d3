"""The picker's ext_proc answers, built in place (``protocol.answer``), are the messages the
protocol's nested form describes: what Envoy reads from them must not depend on how they
were put together."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from taskplane.epp import protocol as P


def _option(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
                                      append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)


def test_the_routing_answer_carries_headers_body_and_metadata() -> None:
    got = P.answer("request_body", headers={"x-gateway-destination-endpoint": "10.0.0.1:8000,10.0.0.2:8000",
                                            "content-length": "2"},
                   remove=["authorization", "x-taskplane-tenant"], body=b"{}",
                   metadata={"envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.1:8000,10.0.0.2:8000"},
                             "taskplane": {"call": "c1:1", "stream": False, "hide_usage": True, "n": 3, "none": None}})
    metadata = struct_pb2.Struct()
    metadata.update({"envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.1:8000,10.0.0.2:8000"},
                     "taskplane": {"call": "c1:1", "stream": False, "hide_usage": True, "n": 3, "none": None}})
    want = pb.ProcessingResponse(
        request_body=pb.BodyResponse(response=pb.CommonResponse(
            header_mutation=pb.HeaderMutation(
                set_headers=[_option("x-gateway-destination-endpoint", "10.0.0.1:8000,10.0.0.2:8000"),
                             _option("content-length", "2")],
                remove_headers=["authorization", "x-taskplane-tenant"]),
            body_mutation=pb.BodyMutation(body=b"{}"))),
        dynamic_metadata=metadata)
    assert got == want
    assert got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)


def test_an_empty_header_set_still_sends_a_mutation_and_nothing_sends_none() -> None:
    with_empty = P.answer("response_headers", headers={})
    assert with_empty.response_headers.response.HasField("header_mutation")
    bare = P.answer("request_headers")
    assert bare.HasField("request_headers") and not bare.request_headers.HasField("response")


def test_a_streamed_chunk_and_an_empty_body_are_set() -> None:
    chunk = P.answer("response_body", streamed=(b"data: x\n\n", False))
    assert chunk.response_body.response.body_mutation.streamed_response.body == b"data: x\n\n"
    assert not chunk.response_body.response.body_mutation.streamed_response.end_of_stream
    empty = P.answer("response_body", body=b"")  # an empty replacement is a replacement, not "leave it"
    assert empty.response_body.response.body_mutation.WhichOneof("mutation") == "body"


def test_an_immediate_reply_has_status_headers_body_and_details() -> None:
    got = P.immediate(429, b'{"error":{}}', {"retry-after": "1"}, details="taskplane overloaded")
    reply = got.immediate_response
    assert reply.status.code == 429 and reply.body == b'{"error":{}}' and reply.details == "taskplane_overloaded"
    assert [(o.header.key, o.header.raw_value) for o in reply.headers.set_headers] == [("retry-after", b"1")]
    assert P.immediate(400, b"").immediate_response.HasField("headers")


def _body_with(attrs: dict[str, str]) -> pb.ProcessingRequest:
    s = struct_pb2.Struct()
    for key, value in attrs.items():
        s.fields[key].string_value = value
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}", end_of_stream=True),
                                attributes={P.EXT_PROC_ATTRS: s})


def test_headers_sent_as_attributes_read_as_a_headers_message_would_carry_them() -> None:
    """The one-message exchange: a repeated taskplane header comes joined with
    commas and is split back (the duplicate check sees both values), a non-taskplane one is
    left whole, and a value the Lua filter sent byte by byte as code points is read back as
    the header message's UTF-8 reading of the same bytes."""
    raw = "caf\xe9-\xff".encode("latin-1")  # a latin-1 header value, not UTF-8
    got = P.attribute_headers(_body_with({
        "request.method": "POST", "request.path": "/v1/chat/completions?x=1",
        "request.headers['x-taskplane-task-id']": "task-a,task-b",
        "request.headers['authorization']": "Bearer k1,Bearer k2",
        "request.headers['x-taskplane-agent']": raw.decode("latin-1"),
        "request.headers['x-taskplane-step']": ""}))
    assert got is not None and got[:2] == [(":method", "POST"), (":path", "/v1/chat/completions?x=1")]
    assert sorted(got[2:]) == sorted([("x-taskplane-task-id", "task-a"), ("x-taskplane-task-id", "task-b"),
                                      ("authorization", "Bearer k1,Bearer k2"),
                                      ("x-taskplane-agent", raw.decode("utf-8", "replace"))])
    headers = P.as_headers(got)
    assert headers.getlist("x-taskplane-task-id") == ["task-a", "task-b"]
    assert headers.getlist("authorization") == ["Bearer k1", "Bearer k2"]  # as_headers splits a joined key, as before
    assert P.attribute_headers(pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}"))) is None
