"""Reading a gateway's cost-row counts and replica health off its own endpoints, for the
bad-upstream tests (the rows handed to the writer, counted on /metrics)."""

from __future__ import annotations

import asyncio
import time

import httpx


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


async def healthy_again(client: httpx.AsyncClient) -> None:
    """A failed attempt benches its replica for ~2 s; wait until every replica is back, so
    every case really reaches the replicas it names."""
    for _ in range(100):
        reps = (await client.get("/admin/replicas")).json()["replicas"]
        if all(r["healthy"] for r in reps):
            await asyncio.sleep(2.1)  # past down_until as well
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"a bad replica never came back: {reps}")
