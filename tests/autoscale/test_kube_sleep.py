"""vLLM sleep mode in the Kubernetes actuator: the fake API server's pods are backed by real
``taskplane sim-engine --enable-sleep-mode`` processes reached through the pod proxy, so a
scale-in victim really sleeps (drops its KV, leaves the gateway's placement) and a
scale-out really wakes it, in its modelled hot-start time rather than a cold start."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from taskplane.autoscale.actuators.kube import (
    DELETION_COST,
    SLEEP_LEVEL,
    KubeActuator,
    KubeError,
    KubeTarget,
)
from taskplane.autoscale.fleet import FleetBook
from taskplane.autoscale.planner import PlannerConfig, TaskplaneAutoscaler
from taskplane.autoscale.types import (
    AgentProfile,
    Generation,
    Phase,
    Plan,
    PoolSignals,
    WorkflowSignal,
)
from taskplane.config import GatewayConfig
from taskplane.engines.registry import ReplicaRegistry
from taskplane.sim.gpus import default_cold_start_s
from taskplane.sim.sleep import wake_seconds
from tests.sim.conftest import SimProc, start_sim

from .fake_kube_scale import FakeScaleApi

SPEED = 10.0
MODEL = "llama-3.1-8b"
WAKE_S = wake_seconds("h100", MODEL, 1)
GEN = Generation("h100", 2.5, cold_start_s=default_cold_start_s("h100", MODEL), capacity_per_s=1000.0,
                 max_replicas=4, wake_s=WAKE_S)


@pytest.fixture(scope="module")
def engines() -> Iterator[list[SimProc]]:
    sims = [start_sim("--enable-sleep-mode", speed=SPEED) for _ in range(3)] + [start_sim(speed=SPEED)]
    yield sims
    for s in sims:
        s.stop()


def _client(api: FakeScaleApi) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api.app), base_url="http://kube")


def _signals(book: FleetBook, now: float, workflows: int) -> PoolSignals:
    prof = AgentProfile(work_per_step=500.0, seconds_per_step=5.0)  # 100 work/s per workflow
    return PoolSignals(pool=MODEL, now_s=now, replicas=list(book.replicas.values()), generations=[GEN],
                       min_replicas=1, max_replicas=4, default_profile=prof,
                       workflows=[WorkflowSignal(task_id=f"t{i}", agent="a", steps_remaining=20)
                                  for i in range(workflows)])


async def _sleeping(url: str) -> bool:
    async with httpx.AsyncClient(timeout=10) as c:
        return bool((await c.get(f"{url}/is_sleeping")).json()["is_sleeping"])


async def test_scale_in_sleeps_the_victim_and_scale_out_wakes_it_before_a_cold_start(engines: list[SimProc]) -> None:
    api = FakeScaleApi(backends=[e.url for e in engines[:3]])
    api.add_workload("deployments", "vllm", 2)
    async with _client(api) as c:
        act = KubeActuator(c, KubeTarget("llm", "vllm"), sleep_level=1)
        book = FleetBook(MODEL, [GEN], sleep_level=1)
        for pod in sorted(api.pods):
            book.provision("h100", 0.0, name=pod, ready=True)
        victim = "vllm-1"
        victim_url = api.engine[victim]
        gateway = ReplicaRegistry(GatewayConfig.model_validate({"auth": False, "pools": [{"model": MODEL, "replicas": [
            {"url": api.engine[p], "name": p} for p in sorted(api.pods)]}]}))
        await gateway.start()
        try:
            # the planner's scale-in: the drained victim is retired, and with sleep_level it sleeps
            book.apply(Plan(pool=MODEL, desired=1, drain=[victim]), 10.0)
            assert book.due(11.0) == [(victim, False)]
            assert await act.retire(victim) == "slept"
            book.slept(victim, 11.0)
            assert await _sleeping(victim_url) and await act.replicas() == 2  # the pod (and its GPU) stays
            ann = api.pods[victim]["metadata"]["annotations"]
            assert ann[SLEEP_LEVEL] == "1" and int(ann[DELETION_COST]) < 0
            assert await act.sleeping_pods() == [victim]
            await gateway.scrape(gateway.replicas[victim])
            assert [s.name for s in gateway.least_loaded(MODEL, 2)] == ["vllm-0"]  # out of placement

            # demand comes back: the plan wakes the sleeper first, then starts one cold
            plan = TaskplaneAutoscaler(PlannerConfig(target_load=1.0)).plan(_signals(book, 60.0, workflows=25))
            assert plan.wake == [victim] and plan.start == ["h100"]
            acts = book.apply(plan, 60.0)
            t0 = time.monotonic()
            for pod in acts.wake:
                await act.wake(pod)
            hot = time.monotonic() - t0
            assert await act.start(len(acts.start)) == 3
            assert not await _sleeping(victim_url) and SLEEP_LEVEL not in api.pods[victim]["metadata"]["annotations"]
            await gateway.scrape(gateway.replicas[victim])
            assert {s.name for s in gateway.least_loaded(MODEL, 2)} == {"vllm-0", victim}
        finally:
            await gateway.close()
    # the wake took its modelled hot start (seconds / SPEED), an order of magnitude under a cold start
    assert WAKE_S / SPEED * 0.9 <= hot < GEN.cold_start_s / SPEED
    assert GEN.cold_start_s / WAKE_S > 10
    assert book.replicas[victim].phase is Phase.STARTING
    assert api.proxied == ["POST vllm-1:8000/sleep", "POST vllm-1:8000/wake_up"]


async def test_scale_out_wakes_sleepers_first_and_scale_in_removes_the_drained_one_not_a_sleeper(
        engines: list[SimProc]) -> None:
    api = FakeScaleApi(backends=[e.url for e in engines[:3]])
    api.add_workload("deployments", "vllm", 3)
    async with _client(api) as c:
        act = KubeActuator(c, KubeTarget("llm", "vllm"), sleep_level=2)
        await act.sleep("vllm-0")
        # vllm-2 drained and stopped: the controller deletes it, not the sleeper (deletion cost MIN + 1)
        assert await act.stop("vllm-2") == 2 and api.deleted == ["vllm-2"]
        assert await act.sleeping_pods() == ["vllm-0"]
        woken, replicas = await act.scale_out(2)
        assert woken == ["vllm-0"] and replicas == 3
        assert not await _sleeping(api.engine["vllm-0"]) and await act.sleeping_pods() == []
        await act.sleep("vllm-1")
        assert await act.retire("vllm-1") == "slept"  # already asleep: vLLM's sleep is a no-op then
        await act.wake("vllm-1")
        assert not await _sleeping(api.engine["vllm-1"])


async def test_an_engine_without_sleep_mode_refuses_and_the_pod_is_not_left_marked(engines: list[SimProc]) -> None:
    api = FakeScaleApi(backends=[engines[3].url])
    api.add_workload("deployments", "vllm", 2)  # vllm-1 has no engine behind it
    async with _client(api) as c:
        act = KubeActuator(c, KubeTarget("llm", "vllm"), sleep_level=1)
        with pytest.raises(KubeError, match="404"):
            await act.retire("vllm-0")
        assert SLEEP_LEVEL not in api.pods["vllm-0"]["metadata"]["annotations"]
        with pytest.raises(KubeError, match="503"):
            await act.wake("vllm-1")
        assert await act.replicas() == 2
        off = KubeActuator(c, KubeTarget("llm", "vllm"))  # sleep_level 0: retire removes the pod
        assert await off.retire("vllm-1") == "stopped" and api.deleted == ["vllm-1"]
    with pytest.raises(ValueError, match="sleep_level"):
        KubeActuator(httpx.AsyncClient(), KubeTarget("llm", "x"), sleep_level=3)
