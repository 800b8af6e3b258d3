"""Waiting for a gateway's replicas to be placeable again, for tests that break them."""

from __future__ import annotations

import asyncio

import httpx


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
