"""Issue 19: on taskplane's own Envoy a successful stream costs the picker two ext_proc
messages (the request's headers and body; ``lua-1msg``: one, the body with the headers as
attributes; every test runs on both). Its X-Taskplane-* headers come from the Lua
filter (the routing answer left them per listed endpoint), its row from the access log;
unary and error answers still reach the picker through the answers filter. The picker
counts what it received (``taskplane_epp_messages_total``), so each test asserts the
exact number of messages a call cost."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tp_epp_helpers import MODEL, chat, messages_cost, rows_eventually, sse_usage, tp_headers

from taskplane.dev import processes as proc
from taskplane.dev.local import LocalCluster

#: The request-headers messages a call costs on each bootstrap (``lua-1msg``: none, they come
#: as the body's attributes; ``lua-2msg``: one; ``lua-1msg`` is the default).
_HEADERS_MESSAGES = {"lua-1msg": 0, "lua-2msg": 1}


@pytest.fixture(scope="module", params=sorted(_HEADERS_MESSAGES))
def usage(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def door2(pg_url: str, tmp_path_factory: pytest.TempPathFactory, usage: str) -> Iterator[LocalCluster]:
    """Three replicas behind the front door on bootstrap ``usage``; this module kills and restarts them."""
    saved = os.environ.get("TASKPLANE_EPP_STREAM_USAGE")
    os.environ["TASKPLANE_EPP_STREAM_USAGE"] = usage  # the gateway's process reads it
    c = LocalCluster(Path(tmp_path_factory.mktemp(f"two-{usage}")), replicas=3, gpus=["h100", "l40s", "h100"],
                     database_url=pg_url, speed=20.0)
    try:
        with c:
            yield c
    finally:
        if saved is None:
            os.environ.pop("TASKPLANE_EPP_STREAM_USAGE", None)
        else:
            os.environ["TASKPLANE_EPP_STREAM_USAGE"] = saved


def _task(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_a_stream_costs_one_or_two_messages_and_gets_its_headers_and_exact_row(door2: LocalCluster, pg_url: str,
                                                                                    usage: str) -> None:
    task = _task("two")
    async with httpx.AsyncClient(base_url=door2.gateway_url, timeout=30) as client:
        got: list[httpx.Response] = []

        async def stream() -> None:
            got.append(await client.post("/v1/chat/completions", headers=tp_headers(task, 0),
                                         json=chat("stream", stream=True, max_tokens=12, stream_options={"include_usage": True})))

        cost = await messages_cost(client, stream())
    r = got[0]
    assert r.status_code == 200, r.text
    assert cost == {"request_headers": _HEADERS_MESSAGES[usage], "request_body": 1, "response_headers": 0, "response_body": 0,
                    "answers_streams": 0}, cost
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


async def test_a_unary_answer_still_goes_through_the_answers_filter(door2: LocalCluster, pg_url: str, usage: str) -> None:
    task = _task("unary")
    async with httpx.AsyncClient(base_url=door2.gateway_url, timeout=30) as client:
        got: list[httpx.Response] = []

        async def unary() -> None:
            got.append(await client.post("/v1/chat/completions", json=chat("hello"), headers=tp_headers(task, 0)))

        cost = await messages_cost(client, unary())
    r = got[0]
    assert r.status_code == 200, r.text
    assert cost == {"request_headers": _HEADERS_MESSAGES[usage], "request_body": 1, "response_headers": 1, "response_body": 1,
                    "answers_streams": 1}, cost
    assert float(r.headers["x-taskplane-cost-usd"]) > 0  # known only once the body's usage is: the picker's
    assert "x-taskplane-upstream" not in r.headers
    rows = await rows_eventually(pg_url, task, 1)
    assert [(x["outcome"], x["completion_tokens"]) for x in rows] == [("success", r.json()["usage"]["completion_tokens"])]


async def _faults(client: httpx.AsyncClient, replica_url: str, error_rate: float) -> None:
    r = await client.post(f"{replica_url}/admin/faults", json={"error_rate": error_rate})
    assert r.status_code == 200, r.text


async def test_a_fallback_answer_carries_that_endpoints_headers(door2: LocalCluster, pg_url: str, usage: str) -> None:
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
    assert cost == {"request_headers": _HEADERS_MESSAGES[usage], "request_body": 1, "response_headers": 0, "response_body": 0,
                    "answers_streams": 0}, cost
    served = r.headers["x-taskplane-replica"]
    assert served != pinned.name and r.headers["x-envoy-attempt-count"] == "2"
    assert r.headers["x-taskplane-gpu"] == next(rep.gpu for rep in door2.replicas if rep.name == served)
    rows = [x for x in await rows_eventually(pg_url, task, 3) if x["step"] == 1]
    assert sorted((x["replica"], x["outcome"]) for x in rows) == sorted([(pinned.name, "error"), (served, "success")]), \
        [(x["replica"], x["outcome"]) for x in rows]
    # the fallback's row is begun only from the access log: dated back to its try, it has the try's duration and cost
    ok = next(x for x in rows if x["outcome"] == "success")
    assert ok["total_ms"] > 5 and ok["cost_usd"] > 0 and 0 <= ok["ttft_ms"] <= ok["total_ms"], dict(ok)


#: The earlier bootstraps (the A/B's old data planes) and what a successful stream costs on each.
_OLDER = {"lua-3msg": {"request_headers": 1, "request_body": 1, "response_headers": 1, "response_body": 0, "answers_streams": 0}}


@pytest.mark.parametrize("older", sorted(_OLDER))
async def test_the_older_configs_still_work(door2: LocalCluster, pg_url: str, monkeypatch: pytest.MonkeyPatch,
                                            older: str) -> None:
    """``TASKPLANE_EPP_STREAM_USAGE=lua-3msg`` (the response headers through the picker too):
    the call gets the same headers and row at the older cost."""
    monkeypatch.setenv("TASKPLANE_EPP_STREAM_USAGE", older)
    url, pid = door2.add_gateway()
    task = _task(older)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            got: list[httpx.Response] = []

            async def stream() -> None:
                got.append(await client.post("/v1/chat/completions", json=chat("older", stream=True, max_tokens=12),
                                             headers=tp_headers(task, 0)))

            cost = await messages_cost(client, stream())
        rows = await rows_eventually(pg_url, task, 1)  # before the stop: a signalled process group loses Envoy's last log
    finally:
        proc.stop_pid(pid)
    r = got[0]
    assert r.status_code == 200, r.text
    assert cost == _OLDER[older], cost
    assert r.headers["x-taskplane-replica"] in {rep.name for rep in door2.replicas}
    assert r.headers["cache-control"] == "no-cache"
    assert [(x["outcome"], x["completion_tokens"], x["replica"]) for x in rows] == [
        ("success", 12, r.headers["x-taskplane-replica"])]


async def test_an_error_answer_goes_through_the_answers_filter(door2: LocalCluster, pg_url: str, usage: str) -> None:
    task = _task("down")
    async with httpx.AsyncClient(base_url=door2.gateway_url, timeout=30) as client:
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
    assert cost == {"request_headers": _HEADERS_MESSAGES[usage], "request_body": 1, "response_headers": 1, "response_body": 1,
                    "answers_streams": 1}, cost
    rows = await rows_eventually(pg_url, task, 3)
    assert len(rows) == int(r.headers.get("x-envoy-attempt-count", "3")) and all(x["outcome"] == "error" for x in rows), \
        [(x["replica"], x["outcome"]) for x in rows]
