"""The Kubernetes actuator against a fake API server with the controller's deletion order."""

from __future__ import annotations

import httpx
import pytest

from taskplane.autoscale.actuators.kube import DELETION_COST, KubeActuator, KubeError, KubeTarget
from taskplane.autoscale.types import ReplicaState
from taskplane.autoscale.victims import deletion_costs, fewest_reprefill, kube_default

from .fake_kube_scale import FakeScaleApi


def client(api: FakeScaleApi) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api.app), base_url="http://kube")


async def test_stop_removes_the_chosen_pod_not_the_newest() -> None:
    api = FakeScaleApi()
    api.add_workload("deployments", "vllm", 3)
    pods = sorted(api.pods)  # vllm-0 (oldest) .. vllm-2 (newest)
    async with client(api) as c:
        act = KubeActuator(c, KubeTarget("llm", "vllm"))
        assert await act.replicas() == 3
        # vllm-2 (the controller's default victim) holds the most live-session tokens
        states = [ReplicaState(name=p, gpu="h100", live_session_tokens=t, ready_s=float(i))
                  for i, (p, t) in enumerate(zip(pods, [500, 40, 9000], strict=True))]
        assert kube_default(states, 1) == ["vllm-2"]
        victim = fewest_reprefill(states, 1)[0]
        assert victim == "vllm-1"
        await act.set_deletion_costs(deletion_costs(states))
        assert api.pods["vllm-2"]["metadata"]["annotations"][DELETION_COST] == "9000"
        assert await act.stop(victim) == 2
        assert api.deleted == ["vllm-1"]
        assert sorted(api.pods) == ["vllm-0", "vllm-2"]
        assert await act.start(2) == 4 and len(api.pods) == 4


async def test_leaderworkerset_and_api_errors() -> None:
    api = FakeScaleApi()
    api.add_workload("leaderworkersets", "vllm-70b", 1)
    async with client(api) as c:
        act = KubeActuator(c, KubeTarget("llm", "vllm-70b", kind="LeaderWorkerSet"))
        assert await act.scale_to(0) == 0 and not api.pods
        with pytest.raises(KubeError, match="422"):
            await act.scale_to(-1)
        missing = KubeActuator(c, KubeTarget("llm", "nope"))
        with pytest.raises(KubeError, match="404"):
            await missing.replicas()
        with pytest.raises(KubeError, match="404"):
            await act.set_deletion_costs({"ghost": 1})
    with pytest.raises(ValueError, match="kind"):
        KubeActuator(httpx.AsyncClient(), KubeTarget("llm", "x", kind="CronJob"))
