"""taskplane's endpoint picker: Envoy's ext_proc service, speaking the Gateway API
Inference Extension's endpoint-picker protocol.

Per HTTP request Envoy opens one ext_proc stream. The picker reads the request headers
and body (BUFFERED, or FULL_DUPLEX_STREAMED chunks accumulated to the end of the
stream), runs the SAME intake as the Python gateway (auth, priority caps, validation,
tenant limits, the response cache) and the SAME placer (admission may hold the call
here: Envoy's message timeout is the call's own limit), and answers with the chosen
endpoint and its fallbacks in ``x-gateway-destination-endpoint`` and the ``envoy.lb``
metadata, the body the replica should get (``upstream_body``), or an ImmediateResponse
with the contract's JSON error.

On taskplane's own Envoy (``envoy_config.bootstrap``) that is all the routing filter's
stream carries: a successful stream costs the picker two messages. The routing answer
leaves each listed endpoint's X-Taskplane-* headers in the ``taskplane.endpoints``
metadata for the Lua filter (``lua``), and the stream's row comes from its access-log
entry (``accesslog``: who served, after how many tries, the usage). Every other answer
(unary, an error, Envoy's own reply) reaches the picker on a second stream, from the
``taskplane.answers`` filter, which finds its call by the key in the ``taskplane``
metadata. Which filter opened a stream the picker reads from its gRPC metadata
(``EXCHANGE_HEADER``); a stream without it is a GIE-style Envoy's, which sends the
response phases on the same stream: the picker reads who served
(``x-gateway-destination-endpoint-served`` metadata, else Envoy's ``upstream.address``
attribute), adds the ``X-Taskplane-*`` headers, and settles the attempts from a unary
body (buffered to it with ``mode_override``), from the access log (a stream, when that
Envoy runs taskplane's Lua filter), or from the streamed chunks themselves (full duplex).
Which of these settles a call, whatever order they come in, the book decides (``book``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from taskplane.engines.replica import ReplicaState
from taskplane.epp import protocol as P
from taskplane.epp.accesslog import settle_logged
from taskplane.epp.book import StreamBook
from taskplane.epp.calls import PickedCall
from taskplane.epp.deadlines import BodyClock, Inbox, TimedOut, body_timeout_reply
from taskplane.epp.endpoints import EndpointBook
from taskplane.epp.envoy_config import (
    DEST_HEADER,
    ENDPOINTS_NAMESPACE,
    EXCHANGE_HEADER,
    INFERENCE_PATHS,
    LB_NAMESPACE,
    MAX_RETRIES_HEADER,
    NUM_RETRIES,
    REQUEST_NAMESPACE,
    TP_NAMESPACE,
)
from taskplane.epp.timing import BurstTiming
from taskplane.errors import ErrorType, TaskplaneError
from taskplane.gateway import failures
from taskplane.gateway.intake import Call
from taskplane.gateway.openai_extra import reply_usage
from taskplane.gateway.service import Gateway
from taskplane.gateway.streaming import filter_usage_event
from taskplane.gateway.upstream import upstream_body
from taskplane.store.records import Outcome

log = structlog.get_logger(__name__)

SERVED_KEY = "x-gateway-destination-endpoint-served"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
MAX_FALLBACKS = NUM_RETRIES  # Envoy's num_retries: the primary and two more
#: Client headers the replica must not see (the tenant's key, taskplane's own headers), nor
#: Envoy obey (a client's own retry count or per-try timeout).
_STRIP_PREFIXES = ("x-taskplane-", "x-envoy-")
_DUPLEX = (pm.ProcessingMode.FULL_DUPLEX_STREAMED, pm.ProcessingMode.STREAMED)
_PHASES = ("request_headers", "request_body", "request_trailers", "response_headers", "response_body",
           "response_trailers", "")
#: Envoy's response code details when a try's timer gave up on a silent replica.
ENVOY_TIMEOUTS = frozenset({"upstream_per_try_idle_timeout", "upstream_per_try_timeout", "upstream_response_timeout"})


def _attempt_count(headers: dict[str, str]) -> int | None:
    """Envoy's tries for this request (``x-envoy-attempt-count``), when it says."""
    value = headers.get("x-envoy-attempt-count", "")
    return int(value) if value.isdigit() and int(value) >= 1 else None


def _exchange_of(context: Any) -> str | None:
    """Which of taskplane's filters opened this ext_proc stream (``EXCHANGE_HEADER``), or
    None: a GIE-style filter that sends every phase it wants on one stream."""
    for key, value in (context.invocation_metadata() if context is not None else None) or ():
        if key == EXCHANGE_HEADER:
            return str(value)
    return None


@dataclass
class _Exchange:
    """What one ext_proc stream (one HTTP request) has seen so far."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    path: str = ""
    kind: str | None = None
    body: bytearray = field(default_factory=bytearray)
    request_duplex: bool = False
    response_duplex: bool = False
    picked: PickedCall | None = None
    status: int = 0
    response_body: bytearray = field(default_factory=bytearray)
    sse_buf: bytes = b""
    usage: dict[str, Any] = field(default_factory=dict)
    stream_done: bool = False
    engine_reported: bool = False  # the engine's own error event came (a duplex stream)
    generated: int = 0  # content events relayed (a duplex stream the client left: its tokens)
    details: str = ""  # Envoy's response code details (``upstream_per_try_idle_timeout``: the try timed out)
    exchange: str | None = None  # taskplane's filter that opened the stream (``EXCHANGE_HEADER``), or None
    waits_for_log: bool = False  # a stream whose row the access log settles (the Lua filter's usage)
    headers_as_attributes: bool = False  # the headers came with the body (one message: ``envoy_config``)


class Picker(pb_grpc.ExternalProcessorServicer):
    """The ext_proc service over one ``Gateway`` (its registry, placer, ledger, cache)."""

    def __init__(self, gw: Gateway, book: EndpointBook, streams: StreamBook, timing: BurstTiming | None = None) -> None:
        self.gw = gw
        self.book = book
        self.streams = streams
        self.timing = timing  # the decision's latency (``taskplane.epp.timing``), when the picker's runtime keeps it
        self.decisions = 0
        #: ext_proc messages received, by phase (``taskplane_epp_messages_total``): a
        #: successful stream on taskplane's own Envoy costs two; and streams, by filter
        self._messages = gw.metrics.epp_messages
        self._messages.update(dict.fromkeys(_PHASES, 0))
        self._streams = gw.metrics.epp_streams
        self._streams.update(dict.fromkeys(("route", "answers", ""), 0))

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: Any) -> AsyncIterator[pb.ProcessingResponse]:
        ex = _Exchange(exchange=_exchange_of(context))
        self._streams[ex.exchange or ""] += 1
        inbox: Inbox[pb.ProcessingRequest] = Inbox(request_iterator)
        upload = BodyClock(self.gw.config.limits.body_timeout_s)  # see taskplane.epp.deadlines
        first = 0.0  # when the stream's first message reached this code (the decision's clock)
        timed = self.timing is None
        try:
            while (req := await inbox.next(upload.deadline)) is not None:
                got = time.perf_counter()
                first = first or got
                if isinstance(req, TimedOut):
                    yield body_timeout_reply(upload.timeout_s, len(ex.body) if ex.request_duplex else None)
                    break
                if req.HasField("protocol_config"):
                    ex.request_duplex = req.protocol_config.request_body_mode in _DUPLEX
                    ex.response_duplex = req.protocol_config.response_body_mode in _DUPLEX
                replies = await self._on(req, ex)
                if not timed and ex.picked is not None and self.timing is not None:  # the routing answer is built
                    self.timing.decided(first, got)
                for resp in replies:
                    if resp.HasField("immediate_response"):
                        upload.stop()  # answered: the exchange is over
                    sent = time.perf_counter()
                    yield resp
                    if not timed and self.timing is not None:  # until the routing answer: gRPC's write, the loop's turn back
                        self.timing.reply_wait.observe(time.perf_counter() - sent)
                timed = timed or ex.picked is not None
                if req.HasField("request_headers") and ex.kind is not None and not req.request_headers.end_of_stream:
                    upload.start()
                elif req.HasField("request_body") and req.request_body.end_of_stream:
                    upload.stop()
        finally:
            inbox.close()
            if ex.picked is not None and (work := self._let_go(ex, ex.picked)) is not None:
                await asyncio.shield(work)

    def _let_go(self, ex: _Exchange, picked: PickedCall) -> Coroutine[Any, Any, None] | None:
        """The exchange ended: settle its call from the log entry that came meanwhile, or
        leave it to the entry to come, or (the client or Envoy went away) cancel it. What is
        left to await, if anything (usually nothing: no task, no turn of the event loop)."""
        release = self.streams.release(picked)
        if release is None:  # another exchange holds it, or its log entry settled it
            return None
        if release.entry is not None:
            return settle_logged(picked, release.entry, self.replica_at)
        if picked.settled:
            self.streams.settled(picked)
            return None
        if ex.exchange == "route" or ex.waits_for_log or (ex.status and not picked.call.stream and picked.served is not None):
            # routed only (its answer goes to the answers filter or the access log), a stream
            # the Lua filter scans, or a unary answer whose body never came whole (the client
            # left, or the replica broke it off: Envoy answered 502 itself): the entry says which
            self.streams.wait(picked)
            return None
        return self._cancel(ex, picked)  # the client (or Envoy) went away before the answer settled

    async def _cancel(self, ex: _Exchange, picked: PickedCall) -> None:
        await picked.cancelled(ex.generated)
        self.streams.settled(picked)

    async def _on(self, req: pb.ProcessingRequest, ex: _Exchange) -> list[pb.ProcessingResponse]:
        which = req.WhichOneof("request")
        self._messages[which or ""] += 1
        if which == "request_headers":
            return self._request_headers(req, ex)
        if which == "request_body":
            return await self._request_body(req, ex)
        if which == "response_headers":
            return await self._response_headers(req, ex)
        if which == "response_body":
            return await self._response_body(req, ex)
        if which == "request_trailers":
            return [pb.ProcessingResponse(request_trailers=pb.TrailersResponse())]
        if which == "response_trailers":
            return [pb.ProcessingResponse(response_trailers=pb.TrailersResponse())]
        return []

    # ---- request ----------------------------------------------------------------
    def _take_headers(self, ex: _Exchange, pairs: list[tuple[str, str]]) -> None:
        """The request's headers, whichever message carried them (a headers message, or the
        body's attributes when the routing filter skips the headers: ``envoy_config``)."""
        ex.headers = pairs
        pseudo = dict(pairs)
        ex.path = pseudo.get(":path", "").split("?", 1)[0]
        if pseudo.get(":method", "POST") == "POST":
            ex.kind = INFERENCE_PATHS.get(ex.path)

    def _request_headers(self, req: pb.ProcessingRequest, ex: _Exchange) -> list[pb.ProcessingResponse]:
        self._take_headers(ex, P.header_pairs(req.request_headers))
        if ex.kind is None:
            return [pb.ProcessingResponse(request_headers=pb.HeadersResponse())]
        if req.request_headers.end_of_stream:
            ex.request_duplex = False
            return [self._body_less(ex)]
        if ex.request_duplex:
            return []  # answered with the body, once it is whole
        return [pb.ProcessingResponse(request_headers=pb.HeadersResponse())]

    def _body_less(self, ex: _Exchange) -> pb.ProcessingResponse:
        return P.error_reply(TaskplaneError(ErrorType.INVALID_REQUEST, "request body is missing"))

    async def _request_body(self, req: pb.ProcessingRequest, ex: _Exchange) -> list[pb.ProcessingResponse]:
        if not ex.headers and (pairs := P.attribute_headers(req)) is not None:  # one message: headers as attributes
            self._take_headers(ex, pairs)
            ex.headers_as_attributes = True
        if ex.kind is None:  # not ours: pass the body on as it came
            if ex.request_duplex:
                return [P.answer("request_body", streamed=(req.request_body.body, req.request_body.end_of_stream))]
            return [pb.ProcessingResponse(request_body=pb.BodyResponse())]
        ex.body += req.request_body.body
        if len(ex.body) > self.gw.config.limits.max_body_bytes:
            return [P.error_reply(TaskplaneError(ErrorType.PAYLOAD_TOO_LARGE,
                                                 f"request body exceeds the {self.gw.config.limits.max_body_bytes}-byte limit"))]
        if not req.request_body.end_of_stream:
            return [] if ex.request_duplex else [pb.ProcessingResponse(request_body=pb.BodyResponse())]
        return await self._route(req, ex)

    async def _route(self, req: pb.ProcessingRequest, ex: _Exchange) -> list[pb.ProcessingResponse]:
        gw, lc = self.gw, self.gw.lifecycle
        assert ex.kind is not None
        try:
            call = lc.prepare(ex.kind, bytes(ex.body), P.as_headers(ex.headers))
            await lc.admit(call)
        except TaskplaneError as exc:
            return [P.error_reply(exc)]
        try:
            if gw.response_cache is not None and call.deterministic:
                cached = gw.response_cache.get(gw._cache_key(call))
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
        gw = self.gw
        gw.metrics.cache_hits.inc()
        gw.metrics.requests.labels(model=call.pool.model, outcome="cached").inc()
        await gw.ledger.record_cached(call)
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
        names = {s.name for s in self.gw.registry.for_model(call.pool.model)}
        if not names & allowed:
            return None
        return names - {n for n in allowed if n}

    async def _pick(self, req: pb.ProcessingRequest, call: Call, ex: _Exchange) -> list[pb.ProcessingResponse]:
        gw, lc = self.gw, self.gw.lifecycle
        outside = self._subset_exclusions(req, call)
        if outside is None:
            err = TaskplaneError(ErrorType.NO_REPLICA, "no replica of the data plane's endpoint subset serves this call", retry_after_s=1)
            await gw.ledger.record_unplaced(call, err, Outcome.ERROR)
            return [P.error_reply(err)]
        tries = lc.tries(call)
        tries.exclude |= outside
        tries.exclude |= self.book.unreachable
        choice = await lc.choose(call, tries)
        self.decisions += 1
        if isinstance(choice, TaskplaneError):
            return [P.error_reply(choice)]
        model = choice.decision.model or call.pool.model
        fallbacks = self._fallbacks(model, choice.replica, tries.exclude)
        picked = PickedCall(lc, gw.metrics, call, choice, fallbacks, first_try=tries.index)
        ex.picked = picked
        self.streams.route(picked)
        if ex.exchange == "route":  # its answer goes to the answers filter or, a stream, to the access log
            self.streams.wait(picked)
        await picked.begin(0)
        return self._routed(picked, ex)

    def _fallbacks(self, model: str, primary: ReplicaState, exclude: set[str]) -> list[ReplicaState]:
        """Where Envoy goes if the choice fails before anything streamed: the least loaded
        other healthy replicas of the model, in that order."""
        return self.gw.registry.least_loaded(model, MAX_FALLBACKS, skip=exclude | {primary.name})

    def _routed(self, picked: PickedCall, ex: _Exchange) -> list[pb.ProcessingResponse]:
        call = picked.call
        listed = [e for e in (self.book.endpoint(r.name) for r in picked.order) if e]
        endpoints = ",".join(listed)
        body = msgspec.json.encode(upstream_body(call, picked.model))
        remove = [k for k, _ in ex.headers if k.startswith(_STRIP_PREFIXES) or k == "authorization"]
        headers = {DEST_HEADER: endpoints, "content-length": str(len(body)), "content-type": "application/json"}
        if listed:  # Envoy retries the listed replicas only: past the list's end its fallback policy
            # would pick any replica of any pool, or the hung one again (the Python proxy never
            # retries a replica that failed the call), and every try there costs a per-try limit
            headers[MAX_RETRIES_HEADER] = str(len(listed) - 1)
            remove = [k for k in remove if k != MAX_RETRIES_HEADER]
        metadata: dict[str, Any] = {LB_NAMESPACE: {DEST_HEADER: endpoints},
                                    TP_NAMESPACE: {"call": picked.key, "stream": call.stream, "hide_usage": not call.client_wants_usage}}
        if ex.exchange == "route" and call.stream:  # the Lua filter adds the answering endpoint's headers
            metadata[ENDPOINTS_NAMESPACE] = {ep: picked.headers_of(r) for r in picked.order if (ep := self.book.endpoint(r.name))}
        if ex.headers_as_attributes:  # Envoy let the headers on before this answer: the request guard sets these
            metadata[REQUEST_NAMESPACE] = headers
        if ex.request_duplex:
            return [P.answer("request_headers", headers=headers, remove=sorted(set(remove)), metadata=metadata),
                    P.answer("request_body", streamed=(body, True))]
        return [P.answer("request_body", headers=headers, remove=sorted(set(remove)), body=body, metadata=metadata)]

    # ---- response ---------------------------------------------------------------
    def replica_at(self, picked: PickedCall, address: str) -> ReplicaState | None:
        """The replica at endpoint ``address`` (``ip:port``) that answered ``picked``."""
        name = self.book.replica(address)
        if name in self.gw.registry.replicas:
            return self.gw.registry.replicas[name]
        # an endpoint the book does not know (its name did not resolve when the replica
        # joined): one of the picker's own choices answered, known by address
        for choice in picked.order:
            if choice.config.url.split("://", 1)[-1].rstrip("/") == address.strip():
                return choice
        return None

    def _served_replica(self, req: pb.ProcessingRequest, picked: PickedCall, headers: dict[str, str]) -> ReplicaState | None:
        """Who answered: the protocol's ``x-gateway-destination-endpoint-served`` metadata,
        else Envoy's ``upstream.address`` attribute; an Envoy that sends neither is taken
        at its attempt count, else the first choice. None: Envoy answered itself."""
        served = P.metadata_value(req, LB_NAMESPACE, SERVED_KEY) or P.attribute(req, "upstream.address")
        if served:
            replica = self.replica_at(picked, str(served))
            if replica is not None:
                return replica
        if headers.get(":status", "").startswith("5") and "x-envoy-upstream-service-time" not in headers:
            return None
        tries = _attempt_count(headers) or 1
        return picked.order[min(tries - 1, len(picked.order) - 1)]

    async def _response_headers(self, req: pb.ProcessingRequest, ex: _Exchange) -> list[pb.ProcessingResponse]:
        if ex.exchange == "answers" and ex.picked is None:  # the answers filter: the routing answer's call
            ex.picked = self.streams.take(str(P.metadata_value(req, TP_NAMESPACE, "call") or ""))
        picked = ex.picked
        response = dict(P.header_pairs(req.response_headers))
        status = int(response.get(":status", "0") or 0)
        ex.status = status
        ex.details = P.attribute(req, "response.code_details") or ""
        if picked is None:
            return [pb.ProcessingResponse(response_headers=pb.HeadersResponse())]
        tries = _attempt_count(response)
        served = await picked.served_by(self._served_replica(req, picked, response), tries)
        call = picked.call
        if served is None:  # Envoy answered itself: every endpoint it tried failed
            failure = failures.unreachable(picked.order[-1].name, f"Envoy answered {status}", timeout=False)
            await picked.all_failed(failure, tried=(tries or len(picked.order)) if status >= 500 else 0)
            self.gw.metrics.requests.labels(model=call.pool.model, outcome="replica_error").inc()
            return [pb.ProcessingResponse(response_headers=pb.HeadersResponse())]
        if status >= 400:
            return [self._buffer_response(ex, {})]
        headers = picked.headers()
        if call.stream:
            headers["cache-control"] = "no-cache"
            if ex.response_duplex:
                return [P.answer("response_headers", headers=headers)]
            ex.waits_for_log = True  # its row waits for the access log (the Lua filter's usage)
            self.streams.wait(picked)
            # the Lua filter names the replica in the closing error event of a stream it ended early
            return [P.answer("response_headers", headers=headers, metadata={TP_NAMESPACE: {"replica": served.replica.name}})]
        return [self._buffer_response(ex, headers)]

    def _buffer_response(self, ex: _Exchange, headers: dict[str, str]) -> pb.ProcessingResponse:
        """Ask Envoy for the whole response body (unary answers and errors are small)."""
        resp = P.answer("response_headers", headers=headers)
        if not ex.response_duplex:
            resp.mode_override.response_body_mode = pm.ProcessingMode.BUFFERED
        return resp

    async def _response_body(self, req: pb.ProcessingRequest, ex: _Exchange) -> list[pb.ProcessingResponse]:
        chunk, eos = req.response_body.body, req.response_body.end_of_stream
        picked = ex.picked
        if picked is None or picked.settled or picked.served is None:
            return [self._pass_body(ex, chunk, eos)]
        if picked.call.stream and ex.status < 400:
            out = self._scan_stream(ex, chunk)
            if eos:
                out += ex.sse_buf + await self._settle_scanned(ex, picked)
                ex.sse_buf = b""
            return [self._pass_body(ex, out, eos)]
        ex.response_body += chunk
        if ex.response_duplex and not eos:
            return []
        raw = bytes(ex.response_body)
        name = picked.served.replica.name
        if ex.status >= 400:
            failure = self._failure(name, ex, raw)
            await picked.failed(failure)
            err = failure.error
            if failure.retry:  # Envoy ran out of retries on failing engines
                err = await picked.exhausted(err)
            return [self._replace_body(ex, err)]
        try:
            data = json.loads(raw)
            usage = reply_usage(picked.call.kind, data)
        except ValueError as exc:
            failure = failures.broken_response(name, type(exc).__name__)
            await picked.failed(failure)
            return [self._replace_body(ex, await picked.exhausted(failure.error))]
        headers = await picked.succeeded(usage)
        if self.gw.response_cache is not None and picked.call.deterministic:
            self.gw.response_cache.put(self.gw._cache_key(picked.call), data)
        if ex.response_duplex:
            return [P.answer("response_body", headers=headers, streamed=(raw, True))]
        return [P.answer("response_body", headers=headers)]

    def _failure(self, replica: str, ex: _Exchange, body: bytes) -> failures.Failure:
        """An error answer: Envoy's own when the replica stayed silent past the per-try
        limit (a timeout, as the Python proxy records it), else the engine's status."""
        if ex.details in ENVOY_TIMEOUTS:
            limit = self.gw.config.limits.request_timeout_s
            return failures.unreachable(replica, f"no answer within {limit:g} s", timeout=True)
        return failures.from_status(replica, ex.status, body)

    def _replace_body(self, ex: _Exchange, err: TaskplaneError) -> pb.ProcessingResponse:
        """The contract's error instead of what the engine sent."""
        body = json.dumps(err.body()).encode()
        extra = {"retry-after": str(max(1, round(err.retry_after_s)))} if err.retry_after_s is not None else {}
        headers = {":status": str(err.status), "content-type": "application/json", "content-length": str(len(body)), **extra}
        if ex.response_duplex:
            return P.answer("response_body", headers=headers, streamed=(body, True))
        return P.answer("response_body", headers=headers, body=body)

    def _scan_stream(self, ex: _Exchange, chunk: bytes) -> bytes:
        """A streamed answer the data plane sends through the picker (a GIE full-duplex
        Envoy): usage, first token and the end read from the events, as the Python relay does."""
        picked = ex.picked
        assert picked is not None and picked.served is not None
        buf = ex.sse_buf + chunk
        *events, ex.sse_buf = buf.split(b"\n\n")
        outs = []
        for event in events:
            out = filter_usage_event(event, ex.usage, picked.call.client_wants_usage)
            if b'"content"' in event or b'"text"' in event:
                ex.generated += 1
                picked.lc.first_token(picked.served)
            if event.strip() == b"data: [DONE]":
                ex.stream_done = True
            elif event.lstrip().startswith(b'data: {"error"'):
                ex.engine_reported = True
            if out is not None:
                outs.append(out + b"\n\n")
        return b"".join(outs)

    def _pass_body(self, ex: _Exchange, chunk: bytes, eos: bool) -> pb.ProcessingResponse:
        if ex.response_duplex:
            tail = ex.sse_buf if eos else b""
            return P.answer("response_body", streamed=(chunk + tail, eos))
        return P.answer("response_body", body=chunk)

    async def _settle_scanned(self, ex: _Exchange, picked: PickedCall) -> bytes:
        """Settle a stream the picker relayed to its end; what still goes to the client: the
        Python relay's closing error event when the replica ended it early without one."""
        assert picked.served is not None
        if ex.stream_done:
            await picked.succeeded(ex.usage)
            return b""
        what = "reported an error" if ex.engine_reported else "ended the stream before it finished"
        failure = failures.broken_stream(picked.served.replica.name, what, transport=False)
        await picked.failed(failure)
        return b"" if ex.engine_reported else b"data: " + json.dumps(failure.error.body()).encode() + b"\n\n"
