"""On taskplane's own Envoy a successful stream costs the picker one ext_proc message: the
request body, with the request's headers as attributes. Its X-Taskplane-* headers come from
the Lua filter (the routing answer left them per listed endpoint), its row from the access
log; unary and error answers still reach the picker through the answers filter. The picker
counts what it received (``taskplane_epp_messages_total``), so each test asserts the exact
number of messages a call cost."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tp_epp_helpers import MODEL, chat, messages_cost, rows_eventually, sse_usage, tp_headers
from tp_replica_health import healthy_again

from taskplane.dev.local import LocalCluster

#: What a successful stream costs the picker: the body's message alone.
STREAM_COST = {"request_headers": 0, "request_body": 1, "response_headers": 0, "response_body": 0, "answers_streams": 0}
#: What a unary or error answer costs: the body's message, and the answers filter's stream (headers, body).
ANSWERED_COST = {"request_headers": 0, "request_body": 1, "response_headers": 1, "response_body": 1, "answers_streams": 1}


@pytest.fixture(scope="module")
def door2(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three replicas behind the front door; this module sets faults on them."""
    c = LocalCluster(Path(tmp_path_factory.mktemp("cost")), replicas=3, gpus=["h100", "l40s", "h100"],
                     database_url=pg_url, speed=20.0)
    with c:
        yield c


def _task(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_a_stream_costs_one_message_and_gets_its_headers_and_exact_row(door2: LocalCluster, pg_url: str) -> None:
    task = _task("two")
    async with httpx.AsyncClient(base_url=door2.gateway_url, timeout=30) as client:
        got: list[httpx.Response] = []

        async def stream() -> None:
            got.append(await client.post("/v1/chat/completions", headers=tp_headers(task, 0),
                                         json=chat("stream", stream=True, max_tokens=12, stream_options={"include_usage": True})))

        cost = await messages_cost(client, stream())
    r = got[0]
    assert r.status_code == 200, r.text
    assert cost == STREAM_COST, cost
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["x-taskplane-model"] == MODEL
    assert r.headers["x-taskplane-replica"] in {rep.name for rep in door2.replicas}
    gpu = next(rep.gpu for rep in door2.replicas if rep.name == r.headers["x-taskplane-replica"])
    assert r.headers["x-taskplane-gpu"] == gpu
    assert float(r.headers["x-taskplane-queue-ms"]) >= 0
    assert "x-taskplane-upstream" not in r.headers, "the route's upstream header is the Lua filter's, not the client's"
    seen = sse_usage(r.text)
    assert seen is not None and r.text.rstrip().endswith("data: [DONE]")
    rows = await rows_eventually(pg_url, task, 1)
    assert len(rows) == 1
    row = rows[0]
    assert row["outcome"] == "success" and row["replica"] == r.headers["x-taskplane-replica"]
    assert (row["prompt_tokens"], row["completion_tokens"]) == (seen["prompt_tokens"], seen["completion_tokens"])
    assert row["ttft_ms"] is not None and 0 <= row["ttft_ms"] <= row["total_ms"] + 1


async def test_a_unary_answer_still_goes_through_the_answers_filter(door2: LocalCluster, pg_url: str) -> None:
    task = _task("unary")
    async with httpx.AsyncClient(base_url=door2.gateway_url, timeout=30) as client:
        got: list[httpx.Response] = []

        async def unary() -> None:
            got.append(await client.post("/v1/chat/completions", json=chat("hello"), headers=tp_headers(task, 0)))

        cost = await messages_cost(client, unary())
    r = got[0]
    assert r.status_code == 200, r.text
    assert cost == ANSWERED_COST, cost
    assert float(r.headers["x-taskplane-cost-usd"]) > 0  # known only once the body's usage is: the picker's
    assert "x-taskplane-upstream" not in r.headers
    rows = await rows_eventually(pg_url, task, 1)
    assert [(x["outcome"], x["completion_tokens"]) for x in rows] == [("success", r.json()["usage"]["completion_tokens"])]


async def _faults(client: httpx.AsyncClient, replica_url: str, error_rate: float) -> None:
    r = await client.post(f"{replica_url}/admin/faults", json={"error_rate": error_rate})
    assert r.status_code == 200, r.text


async def test_a_fallback_answer_carries_that_endpoints_headers(door2: LocalCluster, pg_url: str) -> None:
    task = _task("fallback")
    session = {"X-Taskplane-Session-Id": task}
    async with httpx.AsyncClient(base_url=door2.gateway_url, timeout=30) as client:
        first = await client.post("/v1/chat/completions", json=chat("warm up"), headers=tp_headers(task, 0, **session))
        pinned = next(rep for rep in door2.replicas if rep.name == first.headers["x-taskplane-replica"])
        await _faults(client, pinned.url, 1.0)  # the session's replica answers 500: Envoy tries the next endpoint
        try:
            got: list[httpx.Response] = []

            async def stream() -> None:
                got.append(await client.post("/v1/chat/completions", json=chat("after the fault", stream=True),
                                             headers=tp_headers(task, 1, **session)))

            cost = await messages_cost(client, stream())
        finally:
            await _faults(client, pinned.url, 0.0)
    r = got[0]
    assert r.status_code == 200 and r.text.rstrip().endswith("[DONE]"), r.text
    assert cost == STREAM_COST, cost
    served = r.headers["x-taskplane-replica"]
    assert served != pinned.name and r.headers["x-envoy-attempt-count"] == "2"
    assert r.headers["x-taskplane-gpu"] == next(rep.gpu for rep in door2.replicas if rep.name == served)
    rows = [x for x in await rows_eventually(pg_url, task, 3) if x["step"] == 1]
    assert sorted((x["replica"], x["outcome"]) for x in rows) == sorted([(pinned.name, "error"), (served, "success")]), \
        [(x["replica"], x["outcome"]) for x in rows]
    # the fallback's row is begun only from the access log: dated back to its try, it has the try's duration and cost
    ok = next(x for x in rows if x["outcome"] == "success")
    assert ok["total_ms"] > 5 and ok["cost_usd"] > 0 and 0 <= ok["ttft_ms"] <= ok["total_ms"], dict(ok)


async def test_an_error_answer_goes_through_the_answers_filter(door2: LocalCluster, pg_url: str) -> None:
    task = _task("down")
    async with httpx.AsyncClient(base_url=door2.gateway_url, timeout=30) as client:
        await healthy_again(client)  # every replica listed again (an earlier test's fault benched one)
        for rep in door2.replicas:  # every listed endpoint answers 500: the last one's answer reaches the client
            await _faults(client, rep.url, 1.0)
        try:
            got: list[httpx.Response] = []

            async def stream() -> None:
                got.append(await client.post("/v1/chat/completions", json=chat("nobody well", stream=True),
                                             headers=tp_headers(task, 0)))

            cost = await messages_cost(client, stream())
        finally:
            for rep in door2.replicas:
                await _faults(client, rep.url, 0.0)
    r = got[0]
    assert r.status_code in (502, 503), r.text
    assert r.headers["content-type"] == "application/json" and "error" in r.json()  # the picker's, not the engine's
    assert cost == ANSWERED_COST, cost
    rows = await rows_eventually(pg_url, task, 3)
    assert len(rows) == int(r.headers.get("x-envoy-attempt-count", "3")) and all(x["outcome"] == "error" for x in rows), \
        [(x["replica"], x["outcome"]) for x in rows]
