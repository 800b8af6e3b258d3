"""The response side of the picker: who served a call, its X-Taskplane-* headers, and the
attempts settled from a unary body or an error (the contract's error body instead of the
engine's); a stream waits for its access-log entry, or (a GIE full-duplex Envoy) is scanned
as it passes (``duplex``)."""

from __future__ import annotations

import json

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from taskplane.calls import failures
from taskplane.calls.bodies import sent_adapter
from taskplane.calls.openai_extra import reply_usage
from taskplane.calls.service import CallService
from taskplane.engines.replica import ReplicaState
from taskplane.epp import protocol as P
from taskplane.epp.book import StreamBook
from taskplane.epp.calls import PickedCall
from taskplane.epp.duplex import scan_stream, settle_scanned
from taskplane.epp.endpoints import EndpointBook
from taskplane.epp.envoy_names import LB_NAMESPACE, TP_NAMESPACE
from taskplane.epp.exchange import Exchange, attempt_count
from taskplane.errors import TaskplaneError

SERVED_KEY = "x-gateway-destination-endpoint-served"
#: Envoy's response code details when a try's timer gave up on a silent replica.
ENVOY_TIMEOUTS = frozenset({"upstream_per_try_idle_timeout", "upstream_per_try_timeout", "upstream_response_timeout"})


class ResponseSettling:
    """From the answer Envoy shows the picker to the call's settled attempts."""

    def __init__(self, calls: CallService, book: EndpointBook, streams: StreamBook) -> None:
        self.calls = calls
        self.book = book
        self.streams = streams

    def replica_at(self, picked: PickedCall, address: str) -> ReplicaState | None:
        """The replica at endpoint ``address`` (``ip:port``) that answered ``picked``."""
        name = self.book.replica(address)
        if name in self.calls.registry.replicas:
            return self.calls.registry.replicas[name]
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
        tries = attempt_count(headers) or 1
        return picked.order[min(tries - 1, len(picked.order) - 1)]

    async def response_headers(self, req: pb.ProcessingRequest, ex: Exchange) -> list[pb.ProcessingResponse]:
        if ex.exchange == "answers" and ex.picked is None:  # the answers filter: the routing answer's call
            ex.picked = self.streams.take(str(P.metadata_value(req, TP_NAMESPACE, "call") or ""))
        picked = ex.picked
        response = dict(P.header_pairs(req.response_headers))
        status = int(response.get(":status", "0") or 0)
        ex.status = status
        ex.details = P.attribute(req, "response.code_details") or ""
        if picked is None:
            return [pb.ProcessingResponse(response_headers=pb.HeadersResponse())]
        tries = attempt_count(response)
        served = await picked.served_by(self._served_replica(req, picked, response), tries)
        call = picked.call
        if served is None:  # Envoy answered itself: every endpoint it tried failed
            failure = failures.unreachable(picked.order[-1].name, f"Envoy answered {status}", timeout=False)
            await picked.all_failed(failure, tried=(tries or len(picked.order)) if status >= 500 else 0)
            self.calls.metrics.requests.labels(model=call.pool.model, outcome="replica_error").inc()
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

    def _buffer_response(self, ex: Exchange, headers: dict[str, str]) -> pb.ProcessingResponse:
        """Ask Envoy for the whole response body (unary answers and errors are small)."""
        resp = P.answer("response_headers", headers=headers)
        if not ex.response_duplex:
            resp.mode_override.response_body_mode = pm.ProcessingMode.BUFFERED
        return resp

    async def response_body(self, req: pb.ProcessingRequest, ex: Exchange) -> list[pb.ProcessingResponse]:
        chunk, eos = req.response_body.body, req.response_body.end_of_stream
        picked = ex.picked
        if picked is None or picked.settled or picked.served is None:
            return [self._pass_body(ex, chunk, eos)]
        if picked.call.stream and ex.status < 400:
            out = scan_stream(ex, chunk)
            if eos:
                out += ex.sse_buf + await settle_scanned(ex, picked)
                ex.sse_buf = b""
            return [self._pass_body(ex, out, eos)]
        ex.response_body += chunk
        if ex.response_duplex and not eos:
            return []
        raw = bytes(ex.response_body)
        name = picked.served.replica.name
        if ex.status >= 400:
            failure = self._failure(name, ex, raw, sent_adapter(picked.call, picked.model))
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
        self.calls.keep_answer(picked.call, data)
        if ex.response_duplex:
            return [P.answer("response_body", headers=headers, streamed=(raw, True))]
        return [P.answer("response_body", headers=headers)]

    def _failure(self, replica: str, ex: Exchange, body: bytes, adapter: str | None) -> failures.Failure:
        """An error answer: Envoy's own when the replica stayed silent past the per-try
        limit (a timeout, as the Python proxy records it), else the engine's status."""
        if ex.details in ENVOY_TIMEOUTS:
            limit = self.calls.config.limits.request_timeout_s
            return failures.unreachable(replica, f"no answer within {limit:g} s", timeout=True)
        return failures.from_status(replica, ex.status, body, adapter)

    def _replace_body(self, ex: Exchange, err: TaskplaneError) -> pb.ProcessingResponse:
        """The contract's error instead of what the engine sent."""
        body = json.dumps(err.body()).encode()
        extra = {"retry-after": str(max(1, round(err.retry_after_s)))} if err.retry_after_s is not None else {}
        headers = {":status": str(err.status), "content-type": "application/json", "content-length": str(len(body)), **extra}
        if ex.response_duplex:
            return P.answer("response_body", headers=headers, streamed=(body, True))
        return P.answer("response_body", headers=headers, body=body)


    def _pass_body(self, ex: Exchange, chunk: bytes, eos: bool) -> pb.ProcessingResponse:
        if ex.response_duplex:
            tail = ex.sse_buf if eos else b""
            return P.answer("response_body", streamed=(chunk + tail, eos))
        return P.answer("response_body", body=chunk)

