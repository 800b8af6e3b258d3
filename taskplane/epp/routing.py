"""The request side of the picker: an inference request's headers and body, the SAME
intake and placement as the Python proxy (``taskplane.calls``), and the routing answer that
names the chosen endpoint and its fallbacks for Envoy (``x-gateway-destination-endpoint``,
the ``envoy.lb`` metadata), the body the replica gets, or the contract's error."""

from __future__ import annotations

from typing import Any

import msgspec
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from taskplane.calls.bodies import upstream_body
from taskplane.calls.disagg import PREFILLER_HEADER, prefiller_host_port
from taskplane.calls.intake import Call
from taskplane.calls.service import CallService
from taskplane.engines.replica import ReplicaState
from taskplane.epp import protocol as P
from taskplane.epp.book import StreamBook
from taskplane.epp.calls import PickedCall
from taskplane.epp.endpoints import EndpointBook
from taskplane.epp.envoy_names import (
    DEST_HEADER,
    ENDPOINTS_NAMESPACE,
    INFERENCE_PATHS,
    LB_NAMESPACE,
    MAX_RETRIES_HEADER,
    NUM_RETRIES,
    REQUEST_NAMESPACE,
    TP_NAMESPACE,
)
from taskplane.epp.exchange import Exchange
from taskplane.errors import ErrorType, TaskplaneError
from taskplane.store.records import Outcome

SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
MAX_FALLBACKS = NUM_RETRIES  # Envoy's num_retries: the primary and two more
#: Client headers the replica must not see (the tenant's key, taskplane's own headers), nor
#: Envoy obey (a client's own retry count or per-try timeout).
_STRIP_PREFIXES = ("x-taskplane-", "x-envoy-")
_STRIP_NAMES = frozenset({"authorization", PREFILLER_HEADER})  # a client never names the prefiller


class RequestRouting:
    """From an inference request's headers and body to the routing answer (or a refusal)."""

    def __init__(self, calls: CallService, book: EndpointBook, streams: StreamBook) -> None:
        self.calls = calls
        self.book = book
        self.streams = streams
        self.endpoint_headers = EndpointHeaders()

    def _take_headers(self, ex: Exchange, pairs: list[tuple[str, str]]) -> None:
        """The request's headers, whichever message carried them (a headers message, or the
        body's attributes when the routing filter skips the headers: ``envoy_filters``)."""
        ex.headers = pairs
        pseudo = dict(pairs)
        ex.path = pseudo.get(":path", "").split("?", 1)[0]
        if pseudo.get(":method", "POST") == "POST":
            ex.kind = INFERENCE_PATHS.get(ex.path)

    def request_headers(self, req: pb.ProcessingRequest, ex: Exchange) -> list[pb.ProcessingResponse]:
        self._take_headers(ex, P.header_pairs(req.request_headers))
        if ex.kind is None:
            return [pb.ProcessingResponse(request_headers=pb.HeadersResponse())]
        if req.request_headers.end_of_stream:
            ex.request_duplex = False
            return [self._body_less(ex)]
        if ex.request_duplex:
            return []  # answered with the body, once it is whole
        return [pb.ProcessingResponse(request_headers=pb.HeadersResponse())]

    def _body_less(self, ex: Exchange) -> pb.ProcessingResponse:
        return P.error_reply(TaskplaneError(ErrorType.INVALID_REQUEST, "request body is missing"))

    async def request_body(self, req: pb.ProcessingRequest, ex: Exchange) -> list[pb.ProcessingResponse]:
        if not ex.headers and (pairs := P.attribute_headers(req)) is not None:  # one message: headers as attributes
            self._take_headers(ex, pairs)
            ex.headers_as_attributes = True
        if ex.kind is None:  # not ours: pass the body on as it came
            if ex.request_duplex:
                return [P.answer("request_body", streamed=(req.request_body.body, req.request_body.end_of_stream))]
            return [pb.ProcessingResponse(request_body=pb.BodyResponse())]
        ex.body += req.request_body.body
        if len(ex.body) > self.calls.config.limits.max_body_bytes:
            return [P.error_reply(TaskplaneError(ErrorType.PAYLOAD_TOO_LARGE,
                                                 f"request body exceeds the {self.calls.config.limits.max_body_bytes}-byte limit"))]
        if not req.request_body.end_of_stream:
            return [] if ex.request_duplex else [pb.ProcessingResponse(request_body=pb.BodyResponse())]
        return await self._route(req, ex)

    async def _route(self, req: pb.ProcessingRequest, ex: Exchange) -> list[pb.ProcessingResponse]:
        lc = self.calls.lifecycle
        assert ex.kind is not None
        try:
            call = lc.prepare(ex.kind, bytes(ex.body), P.as_headers(ex.headers))
            await lc.admit(call)
        except TaskplaneError as exc:
            return [P.error_reply(exc)]
        try:
            cached = self.calls.cached_answer(call)
            if cached is not None:
                return [await self._cached(call, cached)]
            answer = await self._pick(req, call, ex)
        except BaseException:
            if ex.picked is None:
                lc.leave(call)
            raise
        if ex.picked is None:
            lc.leave(call)
        return answer

    async def _cached(self, call: Call, cached: dict[str, Any]) -> pb.ProcessingResponse:
        await self.calls.count_cache_hit(call)
        return P.json_reply(200, cached, {"x-taskplane-replica": "response-cache", "x-taskplane-gpu": "none",
                                          "x-taskplane-cached-tokens": str(call.prompt_tokens), "x-taskplane-queue-ms": "0",
                                          "x-taskplane-cost-usd": "0", "x-taskplane-model": call.pool.model})

    def _subset_exclusions(self, req: pb.ProcessingRequest, call: Call) -> set[str] | None:
        """Replicas outside the data plane's subset hint (GIE: pick only from that list);
        None when no replica of the pool is in it."""
        subset = P.metadata_value(req, SUBSET_NAMESPACE, SUBSET_KEY)
        if subset is None:
            return set()
        allowed = {self.book.replica(str(ep)) for ep in (subset if isinstance(subset, list) else [subset])}
        names = {s.name for s in self.calls.registry.for_model(call.pool.model)}
        if not names & allowed:
            return None
        return names - {n for n in allowed if n}

    async def _pick(self, req: pb.ProcessingRequest, call: Call, ex: Exchange) -> list[pb.ProcessingResponse]:
        calls, lc = self.calls, self.calls.lifecycle
        outside = self._subset_exclusions(req, call)
        if outside is None:
            err = TaskplaneError(ErrorType.NO_REPLICA, "no replica of the data plane's endpoint subset serves this call", retry_after_s=1)
            await calls.ledger.record_unplaced(call, err, Outcome.ERROR)
            return [P.error_reply(err)]
        tries = lc.tries(call)
        tries.exclude |= outside
        tries.exclude |= self.book.unreachable
        choice = await lc.choose(call, tries)
        if isinstance(choice, TaskplaneError):
            return [P.error_reply(choice)]
        model = choice.decision.model or call.pool.model
        fallbacks = self._fallbacks(model, choice.replica, tries.exclude)
        picked = PickedCall(lc, calls.metrics, call, choice, fallbacks, first_try=tries.index)
        ex.picked = picked
        self.streams.route(picked)
        if ex.exchange == "route":  # its answer goes to the answers filter or, a stream, to the access log
            self.streams.wait(picked)
        await picked.begin(0)
        return self._routed(picked, ex)

    def _fallbacks(self, model: str, primary: ReplicaState, exclude: set[str]) -> list[ReplicaState]:
        """Where Envoy goes if the choice fails before anything streamed: the least loaded
        other healthy replicas of the model, in that order."""
        return self.calls.registry.least_loaded(model, MAX_FALLBACKS, skip=exclude | {primary.name})

    def _routed(self, picked: PickedCall, ex: Exchange) -> list[pb.ProcessingResponse]:
        call = picked.call
        listed = [e for e in (self.book.endpoint(r.name) for r in picked.order) if e]
        endpoints = ",".join(listed)
        body = msgspec.json.encode(upstream_body(call, picked.model))
        remove = [k for k, _ in ex.headers if k.startswith(_STRIP_PREFIXES) or k in _STRIP_NAMES]
        headers = {DEST_HEADER: endpoints, "content-length": str(len(body)), "content-type": "application/json"}
        prefiller = prefiller_host_port(self.calls.registry, picked.choice.decision)
        if prefiller is not None:  # disaggregated: the decode replica's sidecar prefills there first
            headers[PREFILLER_HEADER] = prefiller
            remove = [k for k in remove if k != PREFILLER_HEADER]
        if listed:  # Envoy retries the listed replicas only: past the list's end its fallback policy
            # would pick any replica of any pool, or the hung one again (the Python proxy never
            # retries a replica that failed the call), and every try there costs a per-try limit
            headers[MAX_RETRIES_HEADER] = str(len(listed) - 1)
            remove = [k for k in remove if k != MAX_RETRIES_HEADER]
        metadata: dict[str, Any] = {LB_NAMESPACE: {DEST_HEADER: endpoints},
                                    TP_NAMESPACE: {"call": picked.key, "stream": call.stream, "hide_usage": not call.client_wants_usage}}
        if ex.headers_as_attributes:  # Envoy let the headers on before this answer: the request guard sets these
            metadata[REQUEST_NAMESPACE] = headers
        if ex.request_duplex:
            answers = [P.answer("request_headers", headers=headers, remove=sorted(set(remove)), metadata=metadata),
                       P.answer("request_body", streamed=(body, True))]
        else:
            answers = [P.answer("request_body", headers=headers, remove=sorted(set(remove)), body=body, metadata=metadata)]
        if ex.exchange == "route" and call.stream:  # the Lua filter adds the answering endpoint's headers
            self.endpoint_headers.fill(answers[0].dynamic_metadata.fields[ENDPOINTS_NAMESPACE].struct_value, picked,
                                       [(ep, r) for r in picked.order if (ep := self.book.endpoint(r.name))])
        return answers


#: The one header of an endpoint's answer that differs from call to call.
_QUEUE_MS = "x-taskplane-queue-ms"


class EndpointHeaders:
    """The X-Taskplane-* headers of each listed endpoint's answer (``PickedCall.headers_of``),
    kept as ready ``Struct``s: the replica, GPU and model change with the fleet only, so a
    call copies each endpoint's in (one C copy) and sets its queue time, instead of filling
    every field of every endpoint (the routing answer's costliest part)."""

    MAX_KEPT = 4096  # (replica, GPU, model) combinations; past that the fleet changed a lot: start over

    def __init__(self) -> None:
        self._kept: dict[tuple[str, ...], struct_pb2.Struct] = {}

    def fill(self, target: struct_pb2.Struct, picked: PickedCall, endpoints: list[tuple[str, ReplicaState]]) -> None:
        """``target``'s field per endpoint (``ip:port``): the headers an answer from its replica gets."""
        for endpoint, replica in endpoints:
            headers = picked.headers_of(replica)
            queue_ms = headers.pop(_QUEUE_MS)
            key = tuple(headers.values())
            kept = self._kept.get(key)
            if kept is None:
                if len(self._kept) >= self.MAX_KEPT:
                    self._kept.clear()
                kept = self._kept[key] = P.struct(headers)
            entry = target.fields[endpoint].struct_value
            entry.CopyFrom(kept)
            entry.fields[_QUEUE_MS].string_value = queue_ms

