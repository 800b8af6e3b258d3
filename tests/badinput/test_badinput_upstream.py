"""A replica that answers garbage, breaks off, or hangs: the client gets a clear JSON error
(502/503 before anything was streamed; an SSE error event after), never a 500 and never
a hang, and every attempt still becomes exactly one cost row (counted on /metrics)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from tp_bad_upstream import BadUpstream
from tp_gateway_rows import cost_rows, healthy_again, rows_by_outcome, rows_settled

from taskplane.dev import processes as proc
from taskplane.ports import free_port

MODEL = "llama-3.1-8b"
NON_STREAM = ["garbage", "not-openai", "json-list", "usage-not-object", "html-500", "truncated-body", "close-at-once", "hang"]
STREAM = ["stream-truncated", "stream-garbage-then-close", "stream-hang", "stream-error-event", "stream-ends-early",
          "close-at-once", "html-500"]
#: Streams the replica breaks (connection closed or hung) after tokens went out. The Python
#: proxy ends them with an error event; Envoy cannot: once the response started, its filter
#: manager resets the client's stream with the upstream's (docs/benchmarks.md, data plane).
CUT_ON_ENVOY = {"stream-truncated", "stream-garbage-then-close", "stream-hang"}
#: The data planes: Envoy with taskplane's picker, and the Python proxy.
PLANES = ("envoy", "python")


@pytest.fixture(scope="module", params=PLANES)
def bad_gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, BadUpstream, Path, str]]:
    work = Path(tmp_path_factory.mktemp(f"bad-upstream-{request.param}"))
    upstream = BadUpstream(free_port()).start()
    port = free_port()
    cfg = {"pools": [{"model": MODEL, "replicas": [{"url": f"http://127.0.0.1:{upstream.port}", "name": "bad", "gpu": "h100"}]}],
           "auth": False, "limits": {"request_timeout_s": 3.0}, "outbox_dir": str(work / "outbox")}
    (work / "gw.yaml").write_text(yaml.safe_dump(cfg))
    log = work / "gateway.log"
    pid = proc.spawn([sys.executable, "-m", "taskplane.cli", "gateway", "--config", str(work / "gw.yaml"),
                      "--port", str(port)], log,
                     env={"TASKPLANE_STATE_DIR": str(work), "TASKPLANE_DATA_PLANE": request.param})
    try:
        proc.wait_until(proc.http_ok(f"http://127.0.0.1:{port}/healthz"), "gateway", 60, pid, log)
        yield f"http://127.0.0.1:{port}", upstream, log, request.param
    finally:
        proc.stop_pid(pid)
        upstream.stop()


@pytest.mark.parametrize("mode", NON_STREAM)
async def test_broken_replica_non_stream(bad_gateway: tuple[str, BadUpstream, Path, str], mode: str) -> None:
    url, upstream, log, plane = bad_gateway
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await healthy_again(client)
        before_hits, before_rows = upstream.hits.get(mode, 0), cost_rows((await client.get("/metrics")).text)
        t0 = time.monotonic()
        r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": f"mode:{mode}"}]})
        assert time.monotonic() - t0 < 15
        assert r.status_code in (502, 503), r.text
        err = r.json()["error"]
        assert err["type"] in ("replica_error", "no_replica")
        # Envoy answers a body broken off after the headers itself: by the replica's address, not its name
        assert ("bad" in err["message"]) or (plane.startswith("envoy") and f"127.0.0.1:{upstream.port}" in err["message"]), err
        assert upstream.hits.get(mode, 0) > before_hits, "the broken replica was never asked"
        rows = await rows_settled(client, before_rows) - before_rows
        assert rows == upstream.hits[mode] - before_hits + 1, (
            f"one row per attempt plus the unplaced retry; rows by outcome now: {rows_by_outcome(await client.get('/metrics'))}, "
            f"status {r.status_code}, headers {dict(r.headers)}, gateway log tail: {log.read_text(errors='replace')[-3000:]}")
    assert "Traceback" not in log.read_text(errors="replace")


async def test_nonsense_usage_counts_keep_the_answer_and_its_row(bad_gateway: tuple[str, BadUpstream, Path, str]) -> None:
    """A replica that answers but reports token counts that are not counts: the client
    gets the answer, the attempt still gets its row (with the gateway's own prompt count)."""
    url, upstream, log, _plane = bad_gateway
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await healthy_again(client)
        before_hits = upstream.hits.get("usage-bad-counts", 0)
        before_rows = cost_rows((await client.get("/metrics")).text)
        r = await client.post("/v1/chat/completions",
                              json={"model": MODEL, "messages": [{"role": "user", "content": "mode:usage-bad-counts"}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "ok"
        assert float(r.headers["X-Taskplane-Cost-Usd"]) > 0
        assert cost_rows((await client.get("/metrics")).text) - before_rows == 1
        assert upstream.hits["usage-bad-counts"] == before_hits + 1  # served once, not retried
    assert "Traceback" not in log.read_text(errors="replace")


@pytest.mark.parametrize("mode", STREAM)
async def test_broken_replica_stream(bad_gateway: tuple[str, BadUpstream, Path, str], mode: str) -> None:
    url, _upstream, log, plane = bad_gateway
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": f"mode:{mode}"}]}
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await healthy_again(client)
        before_rows = cost_rows((await client.get("/metrics")).text)
        t0 = time.monotonic()
        cut = False
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            status = r.status_code
            got = bytearray()
            try:
                async for chunk in r.aiter_raw():
                    got += chunk
            except httpx.RemoteProtocolError:  # the connection was closed mid-body
                cut = True
            raw = got.decode("utf-8", "replace")
        assert time.monotonic() - t0 < 15
        if plane.startswith("envoy") and mode in CUT_ON_ENVOY and status == 200:
            # tokens went out, then the replica broke: Envoy cuts the client's stream (never a [DONE]).
            # (If the break reaches Envoy while the picker still holds the response headers, nothing
            # went out yet and the client gets the 502 below instead.)
            assert cut, raw[-300:]
            assert "data: [DONE]" not in raw and raw.startswith("data: "), raw[-300:]
        elif status == 200:
            assert not cut, raw[-300:]
            # something was streamed: no retry possible, the stream must end with an error event
            events = [e for e in raw.split("\n\n") if e.startswith("data: ")]
            last = json.loads(events[-1][6:])
            assert "error" in last, raw[-300:]
            assert "data: [DONE]" not in raw
            if mode == "stream-ends-early":  # the Python relay's closing event, word for word, on every plane
                assert last["error"] == {"type": "replica_error", "message": "replica bad ended the stream before it finished"}
        else:
            assert status in (502, 503), raw
            assert json.loads(raw)["error"]["type"] in ("replica_error", "no_replica")
        rows = await rows_settled(client, before_rows)
        if status == 200:  # one attempt, streamed, then broken: exactly one row (on Envoy, from its access log)
            assert rows == before_rows + 1, (before_rows, rows)
        else:
            assert rows > before_rows
        reps = (await client.get("/admin/replicas")).json()["replicas"]
        assert reps[0]["inflight"] == 0
    assert "Traceback" not in log.read_text(errors="replace")
