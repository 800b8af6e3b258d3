"""How long a pooled connection to a replica may sit idle, for every data plane.

vLLM's server (uvicorn) closes a keep-alive connection after 5 s idle, and so does the
simulator (``REPLICA_KEEP_ALIVE_S``). A request a client sends on such a connection just
as the replica closes it is lost with it (a failed try, its error row, a
retry). So taskplane's side drops idle replica connections
first, at ``REPLICA_IDLE_S``: Envoy's cluster ``idle_timeout`` and the Python proxy's
httpx ``keepalive_expiry`` alike.
"""

from __future__ import annotations

#: A replica closes a keep-alive connection idle this long (vLLM's uvicorn, the simulator).
REPLICA_KEEP_ALIVE_S = 5

#: taskplane closes a pooled replica connection idle this long: before the replica does.
REPLICA_IDLE_S = 4.0
