"""The fault matrix's new rows: Envoy killed under the front door, and the picker killed
behind a GIE-style Envoy. Nothing lost (every attempt has its row), nothing doubled, and
the data plane serves again once the dead part is back."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tp_epp_helpers import chat, rows_eventually, tp_headers

from taskplane.dev import processes as proc
from taskplane.dev.local import LocalCluster


@pytest.fixture(scope="module")
def door_faults(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(Path(tmp_path_factory.mktemp("faults")), replicas=2, database_url=pg_url, speed=5.0)
    with c:
        yield c


def _envoy_pid(c: LocalCluster) -> int:
    return int((c.workdir / f"envoy-{c.gateway_port}" / "envoy.pid").read_text())


async def test_envoy_killed_mid_stream(door_faults: LocalCluster, pg_url: str) -> None:
    c = door_faults
    task = f"kill-envoy-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=c.gateway_url, timeout=60) as client:
        async with client.stream("POST", "/v1/chat/completions", json=chat("a long one", stream=True, max_tokens=2000),
                                 headers=tp_headers(task, 0)) as r:
            assert r.status_code == 200
            os.kill(_envoy_pid(c), signal.SIGKILL)
            with pytest.raises(httpx.HTTPError):
                async for _ in r.aiter_bytes():
                    pass
    # the front door notices, settles the call, and exits so that a supervisor restarts it
    for _ in range(100):
        if not proc.alive(c.gateway_pid):
            break
        await asyncio.sleep(0.1)
    assert not proc.alive(c.gateway_pid), "the gateway kept running without its Envoy"
    got = await rows_eventually(pg_url, task, 1)
    assert len(got) == 1 and got[0]["outcome"] in ("cancelled", "error"), [(r["outcome"], r["error_type"]) for r in got]
    c.start_gateway()
    async with httpx.AsyncClient(base_url=c.gateway_url, timeout=30) as client:
        again = await client.post("/v1/chat/completions", json=chat("after"), headers=tp_headers(task, 1))
    assert again.status_code == 200, again.text
    got = await rows_eventually(pg_url, task, 2)
    assert len(got) == 2 and len({r["attempt_key"] for r in got}) == 2
