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
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from taskplane.calls.service import CallService
from taskplane.engines.replica import ReplicaState
from taskplane.epp.accesslog import settle_logged
from taskplane.epp.answers import ResponseSettling
from taskplane.epp.book import StreamBook
from taskplane.epp.calls import PickedCall
from taskplane.epp.deadlines import BodyClock, Inbox, TimedOut, body_timeout_reply
from taskplane.epp.endpoints import EndpointBook
from taskplane.epp.exchange import DUPLEX, Exchange, exchange_of
from taskplane.epp.routing import RequestRouting
from taskplane.epp.timing import BurstTiming

_PHASES = ("request_headers", "request_body", "request_trailers", "response_headers", "response_body",
           "response_trailers", "")


class Picker(pb_grpc.ExternalProcessorServicer):
    """The ext_proc service over one ``CallService`` (its registry, placer, ledger, cache)."""

    def __init__(self, calls: CallService, book: EndpointBook, streams: StreamBook, timing: BurstTiming | None = None) -> None:
        self.calls = calls
        self.book = book
        self.streams = streams
        self.timing = timing  # the decision's latency (``taskplane.epp.timing``), when the picker's runtime keeps it
        self.routing = RequestRouting(calls, book, streams)  # the request: intake, placement, the routing answer
        self.answers = ResponseSettling(calls, book, streams)  # the response: who served, the settled attempts
        #: ext_proc messages received, by phase (``taskplane_epp_messages_total``): a
        #: successful stream on taskplane's own Envoy costs two; and streams, by filter
        self._messages = calls.metrics.epp_messages
        self._messages.update(dict.fromkeys(_PHASES, 0))
        self._streams = calls.metrics.epp_streams
        self._streams.update(dict.fromkeys(("route", "answers", ""), 0))

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: Any) -> AsyncIterator[pb.ProcessingResponse]:
        ex = Exchange(exchange=exchange_of(context))
        self._streams[ex.exchange or ""] += 1
        inbox: Inbox[pb.ProcessingRequest] = Inbox(request_iterator)
        upload = BodyClock(self.calls.config.limits.body_timeout_s)  # see taskplane.epp.deadlines
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
                    ex.request_duplex = req.protocol_config.request_body_mode in DUPLEX
                    ex.response_duplex = req.protocol_config.response_body_mode in DUPLEX
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

    def _let_go(self, ex: Exchange, picked: PickedCall) -> Coroutine[Any, Any, None] | None:
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

    def replica_at(self, picked: PickedCall, address: str) -> ReplicaState | None:
        """The replica at endpoint ``address`` (``ip:port``) that answered ``picked`` (the access log asks)."""
        return self.answers.replica_at(picked, address)

    async def _cancel(self, ex: Exchange, picked: PickedCall) -> None:
        await picked.cancelled(ex.generated)
        self.streams.settled(picked)

    async def _on(self, req: pb.ProcessingRequest, ex: Exchange) -> list[pb.ProcessingResponse]:
        which = req.WhichOneof("request")
        self._messages[which or ""] += 1
        if which == "request_headers":
            return self.routing.request_headers(req, ex)
        if which == "request_body":
            return await self.routing.request_body(req, ex)
        if which == "response_headers":
            return await self.answers.response_headers(req, ex)
        if which == "response_body":
            return await self.answers.response_body(req, ex)
        if which == "request_trailers":
            return [pb.ProcessingResponse(request_trailers=pb.TrailersResponse())]
        if which == "response_trailers":
            return [pb.ProcessingResponse(response_trailers=pb.TrailersResponse())]
        return []

