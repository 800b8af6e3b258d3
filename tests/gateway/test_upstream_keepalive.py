"""The Python proxy drops an idle replica connection before the replica does (issue 19's
dropped tries, the race Envoy had): its httpx pools expire idle connections at
``REPLICA_IDLE_S``, below the replica's keep-alive, the one constant Envoy's cluster uses."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from taskplane.engines.keepalive import REPLICA_IDLE_S, REPLICA_KEEP_ALIVE_S
from taskplane.gateway.upstream import UpstreamClients


async def test_proxy_pools_expire_idle_connections_before_the_replica() -> None:
    clients = UpstreamClients(request_timeout_s=30.0)
    try:
        client = clients.client_for(cast(Any, SimpleNamespace(name="r0")))
        expiry = client._transport._pool._keepalive_expiry  # type: ignore[attr-defined]
    finally:
        await clients.close()
    assert expiry == REPLICA_IDLE_S
    assert expiry < REPLICA_KEEP_ALIVE_S - 0.5  # the simulator (as vLLM: uvicorn) closes at 5 s

