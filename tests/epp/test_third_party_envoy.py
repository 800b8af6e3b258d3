"""`taskplane epp` behind an Envoy that someone else configured the GIE way: full-duplex
streamed bodies to the picker, the destination read from the ``envoy.lb`` metadata by
``override_host``, static endpoints, retries. It must route, keep sessions, retry, and
write one row per attempt with the exact usage (here the picker sees the stream itself)."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from tp_epp_helpers import chat, rows_eventually, sse_usage, tp_headers

from taskplane.dev import processes as proc
from taskplane.dev.local import LocalCluster
from taskplane.epp.envoy_process import envoy_binary
from taskplane.ports import free_port

T = "type.googleapis.com/"


def gie_envoy(listen: int, admin: int, epp: int, replicas: list[int]) -> dict[str, Any]:
    """An Envoy bootstrap in the shape the GIE's guides give (written here by hand, not by taskplane)."""
    ext_proc = {"name": "envoy.filters.http.ext_proc", "typed_config": {
        "@type": T + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": "300s"},
        "failure_mode_allow": False,
        "message_timeout": "300s",
        "processing_mode": {"request_header_mode": "SEND", "response_header_mode": "SEND",
                            "request_body_mode": "FULL_DUPLEX_STREAMED", "response_body_mode": "FULL_DUPLEX_STREAMED",
                            "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"},
        "metadata_options": {"forwarding_namespaces": {"untyped": ["envoy.lb"]},
                             "receiving_namespaces": {"untyped": ["envoy.lb"]}},
    }}
    hcm = {"@type": T + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
           "stat_prefix": "gie", "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"],
           "include_attempt_count_in_response": True, "routes": [{"match": {"prefix": "/"}, "route": {
               "cluster": "pool", "timeout": "0s",
               "retry_policy": {"retry_on": "connect-failure,reset-before-request,5xx", "num_retries": 2}}}]}]},
           "http_filters": [ext_proc, {"name": "envoy.filters.http.router",
                                       "typed_config": {"@type": T + "envoy.extensions.filters.http.router.v3.Router"}}]}
    pool = {"name": "pool", "type": "STATIC", "connect_timeout": "2s",
            "load_assignment": {"cluster_name": "pool", "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}} for p in replicas]}]},
            "load_balancing_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.override_host",
                "typed_config": {"@type": T + "envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                                 "override_host_sources": [{"metadata": {"key": "envoy.lb",
                                                                          "path": [{"key": "x-gateway-destination-endpoint"}]}}],
                                 "fallback_policy": {"policies": [{"typed_extension_config": {
                                     "name": "envoy.load_balancing_policies.round_robin",
                                     "typed_config": {"@type": T + "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"}}}]}}}}]}}
    epp_cluster = {"name": "epp", "type": "STATIC", "connect_timeout": "2s",
                   "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                       "@type": T + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                       "explicit_http_config": {"http2_protocol_options": {}}}},
                   "load_assignment": {"cluster_name": "epp", "endpoints": [{"lb_endpoints": [
                       {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": epp}}}}]}]}}
    return {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
            "static_resources": {"listeners": [{"name": "gie", "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                                                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                                                "typed_config": hcm}]}]}],
                                 "clusters": [pool, epp_cluster]}}


class GieStack:
    def __init__(self, workdir: Path, pg_url: str, speed: float = 50.0) -> None:
        self.cluster = LocalCluster(workdir, replicas=3, database_url=pg_url, speed=speed)
        self.workdir = workdir
        self.pg_url = pg_url
        self.epp_port, self.listen, self.admin = free_port(), free_port(), free_port()
        self.epp_pid: int | None = None
        self.envoy_pid: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen}"

    def start_epp(self) -> None:
        cfg = self.workdir / "epp.yaml"
        cfg.write_text(yaml.safe_dump(self.cluster.config(), sort_keys=False))
        log = self.workdir / "logs" / "epp.log"
        self.epp_pid = proc.spawn([sys.executable, "-m", "taskplane.cli", "epp", "--config", str(cfg), "--port", str(self.epp_port),
                                   "--host", "127.0.0.1"], log,
                                  env={"TASKPLANE_DATABASE_URL": self.pg_url, "TASKPLANE_STATE_DIR": str(self.workdir)})
        proc.wait_until(proc.tcp_open(self.epp_port), "epp", 60, self.epp_pid, log)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for r in self.cluster.replicas:
            self.cluster.start_replica(r)
        self.start_epp()
        conf = self.workdir / "gie-envoy.json"
        conf.write_text(json.dumps(gie_envoy(self.listen, self.admin, self.epp_port, [r.port for r in self.cluster.replicas])))
        log = self.workdir / "logs" / "gie-envoy.log"
        self.envoy_pid = proc.spawn([str(envoy_binary()), "-c", str(conf), "--concurrency", "1", "--base-id", str(self.admin),
                                     "--log-level", "warning"], log)
        proc.wait_until(proc.http_ok(f"http://127.0.0.1:{self.admin}/ready"), "envoy", 30, self.envoy_pid, log)

    def stop(self) -> None:
        proc.stop_pid(self.envoy_pid)
        proc.stop_pid(self.epp_pid)
        self.cluster.stop()


@pytest.fixture(scope="module")
def gie(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GieStack]:
    s = GieStack(Path(tmp_path_factory.mktemp("gie")), pg_url)
    try:
        s.start()
        yield s
    finally:
        s.stop()


async def test_routes_keeps_sessions_and_writes_exact_rows(gie: GieStack, pg_url: str) -> None:
    task = f"gie-{uuid.uuid4().hex[:8]}"
    session = {"X-Taskplane-Session-Id": task}
    seen = []
    async with httpx.AsyncClient(base_url=gie.url, timeout=30) as client:
        for step in range(3):
            r = await client.post("/v1/chat/completions", json=chat("gie step " * (step + 1)), headers=tp_headers(task, step, **session))
            assert r.status_code == 200, r.text
            seen.append(r.headers["x-taskplane-replica"])
        s = await client.post("/v1/chat/completions", json=chat("gie stream", stream=True, stream_options={"include_usage": True}),
                              headers=tp_headers(task, 3, **session))
        plain = await client.post("/v1/chat/completions", json=chat("gie plain", stream=True), headers=tp_headers(task, 4, **session))
        refused = await client.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert len(set(seen)) == 1, seen
    assert s.status_code == 200 and s.text.rstrip().endswith("data: [DONE]")
    assert plain.status_code == 200 and sse_usage(plain.text) is None
    usage = sse_usage(s.text)
    assert usage is not None
    assert refused.status_code == 404 and refused.json()["error"]["type"] == "model_not_found"
    got = await rows_eventually(pg_url, task, 5)
    assert len(got) == 5 and all(r["outcome"] == "success" for r in got)
    streamed = next(r for r in got if r["step"] == 3)
    assert (streamed["prompt_tokens"], streamed["completion_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])


async def test_retry_on_a_killed_replica(gie: GieStack, pg_url: str) -> None:
    task = f"gie-retry-{uuid.uuid4().hex[:8]}"
    session = {"X-Taskplane-Session-Id": task}
    async with httpx.AsyncClient(base_url=gie.url, timeout=30) as client:
        first = await client.post("/v1/chat/completions", json=chat("warm"), headers=tp_headers(task, 0, **session))
        pinned = first.headers["x-taskplane-replica"]
        index = next(i for i, r in enumerate(gie.cluster.replicas) if r.name == pinned)
        gie.cluster.kill_replica(index)
        second = await client.post("/v1/chat/completions", json=chat("after"), headers=tp_headers(task, 1, **session))
    assert second.status_code == 200, second.text
    assert second.headers["x-taskplane-replica"] != pinned
    tries = int(second.headers.get("x-envoy-attempt-count", "1"))
    got = await rows_eventually(pg_url, task, 2 + (tries - 1))
    step1 = [r for r in got if r["step"] == 1]
    assert len(step1) == tries and sum(r["outcome"] == "success" for r in step1) == 1
    gie.cluster.start_replica(gie.cluster.replicas[index])


async def test_picker_killed_mid_stream_leaves_its_row_to_the_next(gie: GieStack, pg_url: str) -> None:
    """SIGKILL of `taskplane epp` with a stream in flight: Envoy fails the calls closed (no
    picker, no call), the restarted picker writes the killed attempt's row from the journal
    (``gateway_lost``), and serves again."""
    import asyncio
    import os
    import signal

    task = f"gie-kill-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=gie.url, timeout=60) as client:
        async with client.stream("POST", "/v1/chat/completions", json=chat("long", stream=True, max_tokens=3000),
                                 headers=tp_headers(task, 0)) as r:
            assert r.status_code == 200
            assert gie.epp_pid is not None
            os.kill(gie.epp_pid, signal.SIGKILL)
            with pytest.raises(httpx.HTTPError):
                async for _ in r.aiter_bytes():
                    pass
        refused = await client.post("/v1/chat/completions", json=chat("while down"), headers=tp_headers(task, 1))
        assert refused.status_code >= 500
        gie.start_epp()
        await asyncio.sleep(0.5)
        again = await client.post("/v1/chat/completions", json=chat("after"), headers=tp_headers(task, 2))
    assert again.status_code == 200, again.text
    got = await rows_eventually(pg_url, task, 2)
    by_step = {r["step"]: r for r in got}
    assert by_step[0]["error_type"] == "gateway_lost", [(r["step"], r["outcome"], r["error_type"]) for r in got]
    assert by_step[2]["outcome"] == "success"
    assert len({r["attempt_key"] for r in got}) == len(got) and 1 not in by_step


async def test_picker_sigterm_lets_streams_in_flight_end_with_their_rows(pg_url: str, tmp_path: Path) -> None:
    """SIGTERM of `taskplane epp` with streams in flight (what a rollout sends): it goes
    NOT_SERVING but keeps serving the streams it has until they end (at most
    ``STOP_DRAIN_S``, 5 s; gRPC's own stop grace is 2 s), so each one reaches its client
    whole and has exactly one success row with the engine's usage; only then does it stop."""
    import asyncio
    import os
    import signal
    import time

    gie = GieStack(tmp_path, pg_url, speed=10.0)  # streams of ~3-4 s: past gRPC's grace, inside the drain
    task = f"gie-term-{uuid.uuid4().hex[:8]}"
    streams = 8

    async def one(client: httpx.AsyncClient, step: int) -> tuple[bool, int | None, float]:
        body = chat(f"drain {step}", stream=True, max_tokens=4000, stream_options={"include_usage": True})
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=tp_headers(task, step)) as r:
            assert r.status_code == 200
            text = "".join([chunk async for chunk in r.aiter_text()])
        usage = sse_usage(text)
        return "data: [DONE]" in text, (usage or {}).get("completion_tokens"), time.monotonic()  # type: ignore[return-value]

    try:
        gie.start()
        assert gie.epp_pid is not None
        async with httpx.AsyncClient(base_url=gie.url, timeout=60) as client:
            calls = [asyncio.create_task(one(client, i)) for i in range(streams)]
            await asyncio.sleep(0.5)
            assert not any(c.done() for c in calls), "the streams ended before the stop: make them longer"
            os.kill(gie.epp_pid, signal.SIGTERM)
            stopped_at = time.monotonic()
            got_streams = await asyncio.gather(*calls)
        for _ in range(100):
            if not proc.alive(gie.epp_pid):
                break
            await asyncio.sleep(0.1)
        assert not proc.alive(gie.epp_pid), "the picker did not stop after its streams ended"
    finally:
        gie.stop()
    assert all(whole for whole, _, _ in got_streams), got_streams
    lasted = max(end for _, _, end in got_streams) - stopped_at
    assert 2.0 < lasted < 5.0, f"streams lasted {lasted:.1f} s after the SIGTERM: outside what this test tells apart"
    got = await rows_eventually(pg_url, task, streams)
    by_step = {r["step"]: r for r in got}
    assert len(got) == streams, [(r["step"], r["outcome"], r["error_type"]) for r in got]
    for step, (_, tokens, _) in enumerate(got_streams):
        assert by_step[step]["outcome"] == "success", by_step[step]
        assert by_step[step]["completion_tokens"] == tokens
