"""Stopping the front door loses no served call's row: SIGTERM to its process group (what a
supervisor or ``LocalCluster.stop_gateway`` sends) right after streams end, or while they
are in flight, and every call the client got whole has exactly one success row with the
engine's usage (docs/reliability.md, "Stopping the data plane")."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import httpx
import pytest
from tp_epp_helpers import chat, rows, tp_headers

from taskplane.dev import processes as proc
from taskplane.dev.local import LocalCluster

STREAMS = 150


async def _stream(client: httpx.AsyncClient, task: str, step: int, max_tokens: int) -> bool:
    """One streamed call; whether the client got it whole (``[DONE]``)."""
    body = chat(f"call {step}", stream=True, max_tokens=max_tokens)
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=tp_headers(task, step)) as r:
        if r.status_code != 200:
            return False
        return "data: [DONE]" in [line.strip() async for line in r.aiter_lines()]


async def _check_rows(pg_url: str, task: str, whole: list[bool]) -> None:
    got = await rows(pg_url, task)
    by_step: dict[int, list[tuple[str, str | None, int]]] = {}
    for r in got:
        by_step.setdefault(r["step"], []).append((r["outcome"], r["error_type"], r["completion_tokens"]))
    served = [i for i, ok in enumerate(whole) if ok]
    assert served, "no call was served"
    wrong = {i: by_step.get(i) for i in served
             if [o for o, _, _ in by_step.get(i, [])] != ["success"] or by_step[i][0][2] <= 0}
    assert not wrong, f"{len(wrong)} of {len(served)} served calls without exactly one success row: {list(wrong.items())[:5]}"


@pytest.mark.parametrize("in_flight", [False, True], ids=["just-ended", "in-flight"])
async def test_sigterm_keeps_every_served_row(pg_url: str, tmp_path: Path, in_flight: bool) -> None:
    c = LocalCluster(tmp_path, replicas=2, database_url=pg_url, speed=1.0 if in_flight else 20.0)
    task = f"stop-{uuid.uuid4().hex[:8]}"
    with c:
        limits = httpx.Limits(max_connections=STREAMS, max_keepalive_connections=STREAMS)
        async with httpx.AsyncClient(base_url=c.gateway_url, timeout=60, limits=limits) as client:
            calls = [asyncio.create_task(_stream(client, task, i, 120 if in_flight else 16)) for i in range(STREAMS)]
            if in_flight:
                await asyncio.sleep(1.0)  # every stream has started and none has ended
                early = [t.result() if not t.exception() else repr(t.exception()) for t in calls if t.done()]
                assert not early, early[:3]
                stopping = asyncio.create_task(asyncio.to_thread(c.stop_gateway))
                whole = [bool(r) if not isinstance(r, BaseException) else False
                         for r in await asyncio.gather(*calls, return_exceptions=True)]
                await stopping
                assert all(whole), f"{whole.count(False)} in-flight streams cut by a graceful stop"
            else:
                whole = list(await asyncio.gather(*calls))
                assert all(whole)
                await asyncio.to_thread(c.stop_gateway)  # at once: entries may still be in Envoy's buffer
    await _check_rows(pg_url, task, whole)


async def test_envoy_dies_with_a_killed_front_door(pg_url: str, tmp_path: Path) -> None:
    """Envoy is out of the front door's process group (a group SIGTERM reaches only the
    front door), yet a kill -9 of the front door takes Envoy with it (pdeathsig)."""
    c = LocalCluster(tmp_path, replicas=1, database_url=pg_url, speed=20.0)
    with c:
        assert c.gateway_pid is not None
        envoy = int((c.workdir / f"envoy-{c.gateway_port}" / "envoy.pid").read_text())
        assert os.getpgid(envoy) != os.getpgid(c.gateway_pid)
        os.kill(c.gateway_pid, signal.SIGKILL)
        for _ in range(50):
            if not proc.alive(envoy):
                break
            await asyncio.sleep(0.1)
        assert not proc.alive(envoy), "Envoy outlived its killed front door"
