"""Reading a gateway's cost-row counts and replica health off its own endpoints, for the
bad-upstream tests (the rows handed to the writer, counted on /metrics)."""

from __future__ import annotations

import asyncio
import time

import httpx
from tp_replica_health import healthy_again

__all__ = ["cost_rows", "healthy_again", "rows_by_outcome", "rows_settled"]


def cost_rows(metrics: str) -> float:
    """Rows handed to the cost writer so far, every outcome together."""
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in metrics.splitlines() if ln.startswith("taskplane_gateway_cost_rows_total{"))


def rows_by_outcome(metrics: httpx.Response) -> dict[str, str]:
    return {ln.split("{", 1)[1].split("}", 1)[0]: ln.rsplit(" ", 1)[1] for ln in metrics.text.splitlines()
            if ln.startswith("taskplane_gateway_cost_rows_total{")}


async def rows_settled(client: httpx.AsyncClient, before: float) -> float:
    """The row count once rows stopped arriving (a stream's row waits for Envoy's access
    log): polled until it moved and then held still for half a second, at most 10 s."""
    rows, still_since = before, time.monotonic()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        now = cost_rows((await client.get("/metrics")).text)
        if now != rows:
            rows, still_since = now, time.monotonic()
        elif rows > before and time.monotonic() - still_since >= 0.5:
            break
    return rows
