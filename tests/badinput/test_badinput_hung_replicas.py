"""Replicas that take a call and never answer, beside others (both data planes).

A hung replica is given up after ``limits.request_timeout_s`` on that try, and the call
goes to the next replica the picker listed, before anything was streamed: the client gets
the fallback's answer, or, when every listed replica hangs, the contract's JSON error
after each was tried once. Every try that reached a replica is exactly one row, also when
the client leaves while the second try is on its way (Envoy's answer then names no try;
its access log counts them)."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from tp_bad_upstream import BadUpstream
from tp_gateway_rows import cost_rows, healthy_again, rows_by_outcome, rows_settled

from taskplane.dev import processes as proc
from taskplane.ports import free_port

SERVED = "llama-3.1-8b"  # one hung replica and one that answers
HUNG = "llama-3.2-1b"  # two hung replicas
EMPTY = "empty-pool"  # no replica: a call waits for one (scale to zero) longer than LIMIT_S
LIMIT_S = 2.0
EMPTY_HOLD_S = 8.0  # beyond the picker's message timeout as it was (the limit + 5 s)
BODY_SERVED = {"model": SERVED, "messages": [{"role": "user", "content": "mode:hang"}]}
BODY_HUNG = {"model": HUNG, "messages": [{"role": "user", "content": "mode:hang"}]}


@dataclass
class HungPool:
    url: str
    log: Path
    plane: str
    hung: BadUpstream  # in the SERVED pool
    good: BadUpstream  # in the SERVED pool
    pair: tuple[BadUpstream, BadUpstream]  # the HUNG pool

    def hits(self, *ups: BadUpstream) -> int:
        return sum(u.hits.get("hang", 0) for u in ups)

    def detail(self, metrics: httpx.Response) -> str:
        return f"rows by outcome {rows_by_outcome(metrics)}; gateway log tail: {self.log.read_text(errors='replace')[-3000:]}"


@pytest.fixture(scope="module", params=["envoy", "python"])
def hung_pool(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HungPool]:
    work = Path(tmp_path_factory.mktemp(f"hung-{request.param}"))
    hung, good, b, c = (BadUpstream(free_port()).start(), BadUpstream(free_port(), fine=True).start(),
                        BadUpstream(free_port()).start(), BadUpstream(free_port()).start())

    def rep(name: str, u: BadUpstream) -> dict[str, str]:
        return {"url": f"http://127.0.0.1:{u.port}", "name": name, "gpu": "h100"}

    cfg = {"pools": [{"model": SERVED, "replicas": [rep("a-hung", hung), rep("b-good", good)]},
                     {"model": HUNG, "replicas": [rep("hung-b", b), rep("hung-c", c)]},
                     {"model": EMPTY, "replicas": [], "hold_when_empty_s": EMPTY_HOLD_S}],
           "auth": False, "limits": {"request_timeout_s": LIMIT_S}, "outbox_dir": str(work / "outbox")}
    (work / "gw.yaml").write_text(yaml.safe_dump(cfg))
    log = work / "gateway.log"
    port = free_port()
    pid = proc.spawn([sys.executable, "-m", "taskplane.cli", "gateway", "--config", str(work / "gw.yaml"), "--port", str(port)],
                     log, env={"TASKPLANE_STATE_DIR": str(work), "TASKPLANE_DATA_PLANE": request.param})
    try:
        proc.wait_until(proc.http_ok(f"http://127.0.0.1:{port}/healthz"), "gateway", 60, pid, log)
        yield HungPool(url=f"http://127.0.0.1:{port}", log=log, plane=request.param, hung=hung, good=good, pair=(b, c))
    finally:
        proc.stop_pid(pid)
        for u in (hung, good, b, c):
            u.stop()


async def test_a_hung_replica_is_retried_on_the_fallback(hung_pool: HungPool) -> None:
    """The call is served by the replica that answers; the hung one, when tried first, is
    one row of its own. Placement decides who goes first, so calls repeat until one did."""
    p = hung_pool
    tried_hung_first = 0
    async with httpx.AsyncClient(base_url=p.url, timeout=30) as client:
        for _ in range(8):
            await healthy_again(client)
            hung0, rows0 = p.hits(p.hung), cost_rows((await client.get("/metrics")).text)
            fresh = uuid.uuid4().hex  # a new session and prompt: no affinity to the replica that answered last
            body = {**BODY_SERVED, "messages": [{"role": "system", "content": fresh}, *BODY_SERVED["messages"]]}
            t0 = time.monotonic()
            r = await client.post("/v1/chat/completions", json=body, headers={"X-Taskplane-Session-Id": fresh})
            waited = time.monotonic() - t0
            assert r.status_code == 200, r.text
            assert r.headers["x-taskplane-replica"] == "b-good"
            on_hung = p.hits(p.hung) - hung0
            assert on_hung in (0, 1), "a hung replica was tried twice for one call"
            rows = await rows_settled(client, rows0) - rows0
            assert rows == on_hung + 1, f"{on_hung} tries on the hung replica and the answer; {p.detail(await client.get('/metrics'))}"
            tried_hung_first += on_hung
            print(f"[{p.plane}] hung replica tried first: {bool(on_hung)}, served by the fallback after {waited:.2f} s "
                  f"(limit {LIMIT_S:g} s)")
            if tried_hung_first:
                break
    assert tried_hung_first, "placement never tried the hung replica first"
    assert "Traceback" not in p.log.read_text(errors="replace")


async def test_every_replica_hung_is_the_json_error_after_each_was_tried_once(hung_pool: HungPool) -> None:
    p = hung_pool
    async with httpx.AsyncClient(base_url=p.url, timeout=30) as client:
        await healthy_again(client)
        hits0, rows0 = [u.hits.get("hang", 0) for u in p.pair], cost_rows((await client.get("/metrics")).text)
        t0 = time.monotonic()
        r = await client.post("/v1/chat/completions", json=BODY_HUNG)
        print(f"[{p.plane}] both replicas hung: {r.status_code} after {time.monotonic() - t0:.2f} s (limit {LIMIT_S:g} s)")
        assert r.status_code in (502, 503), r.text
        assert r.json()["error"]["type"] in ("no_replica", "replica_error")
        assert [u.hits.get("hang", 0) - h for u, h in zip(p.pair, hits0, strict=True)] == [1, 1], \
            "each listed replica once: none tried twice, none skipped"
        rows = await rows_settled(client, rows0) - rows0
        # two tries and the unplaced row (a third choice found no replica left), as the Python proxy writes them
        assert rows == 3, p.detail(await client.get("/metrics"))
    assert "Traceback" not in p.log.read_text(errors="replace")


async def test_a_client_leaving_during_the_retry_leaves_no_try_without_its_row(hung_pool: HungPool) -> None:
    p = hung_pool
    async with httpx.AsyncClient(base_url=p.url, timeout=30) as client:
        await healthy_again(client)
        hits0, rows0 = p.hits(*p.pair), cost_rows((await client.get("/metrics")).text)
        call = asyncio.ensure_future(client.post("/v1/chat/completions", json=BODY_HUNG))
        for _ in range(300):  # until the second replica holds its try (the first was given up)
            if p.hits(*p.pair) - hits0 == 2 or call.done():
                break
            await asyncio.sleep(0.05)
        assert not call.done(), call.result().text
        assert p.hits(*p.pair) - hits0 == 2
        call.cancel()  # the client leaves: its connection closes mid-try
        await asyncio.gather(call, return_exceptions=True)
        rows = await rows_settled(client, rows0) - rows0
        assert rows == 2, f"both tries reached a replica; {p.detail(await client.get('/metrics'))}"
        reps = (await client.get("/admin/replicas")).json()["replicas"]
        assert sum(r["inflight"] for r in reps) == 0
    assert "Traceback" not in p.log.read_text(errors="replace")


async def test_a_call_held_longer_than_the_limit_gets_the_pickers_answer(hung_pool: HungPool) -> None:
    """A call waiting for a replica of an empty pool (``hold_when_empty_s`` beyond the call's
    limit) is answered by the gateway when the hold ends, in the contract's words; on Envoy
    no timer of its own cuts in first (its stream timer used to, with a bare 504)."""
    p = hung_pool
    async with httpx.AsyncClient(base_url=p.url, timeout=30) as client:
        r = await client.post("/v1/chat/completions", json={**BODY_HUNG, "model": EMPTY})
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["type"] == "no_replica" and "came up within" in err["message"], err
