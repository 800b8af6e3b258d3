"""The Python proxy drops an idle replica connection before the replica does (issue 19's
dropped tries, the race Envoy had): its httpx pools expire idle connections at
``REPLICA_IDLE_S``, below the replica's keep-alive, the one constant Envoy's cluster uses.

Measured on a real socket: a server that never closes a keep-alive connection itself
counts the connections the proxy's client opens, so what it sees is the client's own
expiry, not the server's."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from taskplane.engines.keepalive import REPLICA_IDLE_S, REPLICA_KEEP_ALIVE_S
from taskplane.gateway.upstream import UpstreamClients


class KeepAliveServer:
    """HTTP/1.1 on loopback that answers every request on a connection and keeps it open."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while (head := await reader.readuntil(b"\r\n\r\n")):
                assert head.startswith(b"GET ")
                self.requests += 1
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_proxy_pools_expire_idle_connections_before_the_replica() -> None:
    assert REPLICA_IDLE_S < REPLICA_KEEP_ALIVE_S - 0.5  # the simulator (as vLLM: uvicorn) closes at 5 s
    server = KeepAliveServer()
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/health"
    clients = UpstreamClients(request_timeout_s=30.0)
    try:
        client = clients.client_for(cast(Any, SimpleNamespace(name="r0")))
        assert (await client.get(url)).text == "ok"
        await asyncio.sleep(REPLICA_IDLE_S / 4)
        assert (await client.get(url)).text == "ok"
        assert server.connections == 1  # a connection idle for less than the expiry is reused
        await asyncio.sleep(REPLICA_IDLE_S + 0.5)  # idle past the expiry, still before the replica's 5 s
        assert (await client.get(url)).text == "ok"
        assert server.connections == 2  # the client dropped the idle one and opened a new connection
        assert server.requests == 3
    finally:
        await clients.close()
        listener.close()
        await listener.wait_closed()
