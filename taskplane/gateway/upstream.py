"""The proxy's HTTP side toward replicas: pooled clients, a
send that gives up once the replica is marked down, and what a response says
(``open_response``, ``read_completion``), turned into ``failures.Failure``s: the only
httpx-specific part of an attempt.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import httpx

from taskplane.calls import failures
from taskplane.calls.failures import Failure
from taskplane.calls.openai_extra import reply_usage
from taskplane.engines.keepalive import REPLICA_IDLE_S
from taskplane.engines.replica import ReplicaState

UPSTREAM_POOLS = 8  # upstream connection pools per replica (see UpstreamClients.client_for)


class ReplicaDown(Exception):
    """The replica was marked down while an attempt waited for its response headers."""


class UpstreamClients:
    """The HTTP clients the gateway sends replicas their calls with, a few per replica."""

    def __init__(self, request_timeout_s: float) -> None:
        self.request_timeout_s = request_timeout_s
        self._pools: dict[str, list[httpx.AsyncClient]] = {}
        self._pool_turn = 0
        self._tls: ssl.SSLContext | None = None

    def client_for(self, replica: ReplicaState) -> httpx.AsyncClient:
        """An upstream client for this replica. httpcore scans every connection of a pool
        for each request, which is quadratic at a thousand streams; a few small pools per
        replica, taken in turn, keep each scan short."""
        clients = self._pools.get(replica.name)
        if clients is None:
            timeout = httpx.Timeout(self.request_timeout_s, connect=5.0)  # a connect burst is not death
            # idle connections closed before the replica closes them (``taskplane.engines.keepalive``)
            limits = httpx.Limits(max_connections=1000, max_keepalive_connections=64, keepalive_expiry=REPLICA_IDLE_S)
            if self._tls is None:
                self._tls = ssl.create_default_context()  # one CA load, not one per pool
            clients = self._pools[replica.name] = [httpx.AsyncClient(timeout=timeout, limits=limits, verify=self._tls)
                                                   for _ in range(UPSTREAM_POOLS)]
        self._pool_turn += 1
        return clients[self._pool_turn % len(clients)]

    async def close(self) -> None:
        for clients in self._pools.values():
            for c in clients:
                await c.aclose()
        self._pools.clear()



async def send_unless_down(client: httpx.AsyncClient, req: httpx.Request, replica: ReplicaState) -> httpx.Response:
    """Send upstream, but give up as soon as the registry sees the replica stop answering
    its health probe: nothing was streamed yet, so the call is retried elsewhere in
    seconds instead of waiting out ``request_timeout_s`` on a hung engine."""
    send = asyncio.ensure_future(client.send(req, stream=True))
    down = asyncio.ensure_future(replica.down_signal.wait())
    try:
        await asyncio.wait({send, down}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        down.cancel()
        if not send.done():
            send.cancel()
            await asyncio.gather(send, return_exceptions=True)
    if send.cancelled():
        raise ReplicaDown(f"replica {replica.name} stopped answering its health probe")
    return send.result()


class AttemptFailed(Exception):
    """An upstream attempt failed; ``failure`` says how (``failures``)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.error.message)
        self.failure = failure


async def open_response(client: httpx.AsyncClient, req: httpx.Request, replica: ReplicaState,
                        adapter: str | None = None) -> httpx.Response:
    """Send the attempt and return the replica's successful response, its body still to
    read; any other ending raises ``AttemptFailed`` (the response already closed).
    ``adapter``: the LoRA adapter asked for (a 404 then says the replica lacks it)."""
    try:
        resp = await send_unless_down(client, req, replica)
    except (httpx.HTTPError, OSError, ReplicaDown) as exc:
        raise AttemptFailed(failures.unreachable(replica.name, type(exc).__name__,
                                                 timeout=isinstance(exc, httpx.TimeoutException))) from None
    replica.saw_progress()
    if resp.status_code < 400:
        return resp
    try:
        body = await resp.aread()
    except (httpx.HTTPError, OSError) as exc:
        raise AttemptFailed(failures.broken_response(replica.name, type(exc).__name__)) from None
    finally:
        await resp.aclose()
    raise AttemptFailed(failures.from_status(replica.name, resp.status_code, body, adapter))


async def read_completion(resp: httpx.Response, replica: ReplicaState, kind: str = "chat") -> tuple[dict[str, Any], dict[str, Any]]:
    """A unary answer's object (of the call's ``kind``) and its usage in chat-completion
    terms, or ``AttemptFailed`` when it is not such an object. The response is closed
    either way."""
    try:
        data = json.loads(await resp.aread())
        usage = reply_usage(kind, data)
    except (httpx.HTTPError, OSError, ValueError) as exc:
        raise AttemptFailed(failures.broken_response(replica.name, type(exc).__name__)) from None
    finally:
        await resp.aclose()
    return data, usage
