"""Live: `taskplane dev up --autoscale 1:4` grows on a burst of agent calls, shrinks back
after an idle minute, lists replicas as they come and go, and fails no call."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from taskplane.dev import processes as proc
from taskplane.dev.ports import free_base

pytestmark = pytest.mark.stack


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "taskplane.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


def _replicas(state: Path) -> list[dict[str, object]]:
    return list(json.loads(_cli("dev", "status", "--json", "--state-dir", str(state)).stdout)["replicas"])


async def _burst(gateway: str, agents: int, steps: int) -> dict[str, int]:
    """Agents calling step after step; a 429 is retried after Retry-After as the SDK does."""
    out = {"ok": 0, "shed_retried": 0, "failed": 0}
    errors: dict[str, int] = {}

    async def agent(c: httpx.AsyncClient, i: int) -> None:
        for step in range(steps):
            for _ in range(30):
                r = await c.post(f"{gateway}/v1/chat/completions", timeout=300, json={
                    "model": "llama-3.1-8b", "max_tokens": 300,
                    "messages": [{"role": "user", "content": f"agent {i} step {step} " + "x " * 400}]},
                    headers={"X-Taskplane-Task-Id": f"burst-{i}", "X-Taskplane-Step": str(step),
                             "X-Taskplane-Steps-Remaining": str(steps - step - 1)})
                if r.status_code == 429:
                    out["shed_retried"] += 1
                    await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                    continue
                out["ok" if r.status_code == 200 else "failed"] += 1
                if r.status_code != 200:
                    key = f"{r.status_code} {r.text[:120]}"
                    errors[key] = errors.get(key, 0) + 1
                break
            else:
                out["failed"] += 1

    async with httpx.AsyncClient() as c:
        await asyncio.gather(*(agent(c, i) for i in range(agents)))
    if errors:
        print("failed calls:", errors)
    return out


# a live dev stack on 2 cores: a replica started under load can miss its health probes (seen once in CI-like runs)
@pytest.mark.flaky(reruns=2)
def _burst_counting_replicas(gateway: str, state: Path, *, agents: int, steps: int) -> tuple[dict[str, int], list[int]]:
    """A burst of agents (see ``_burst``), and the replicas ``dev status`` listed every 2 s while it ran."""
    sizes: list[int] = []

    async def burst_and_watch() -> dict[str, int]:
        task = asyncio.create_task(_burst(gateway, agents=agents, steps=steps))
        while not task.done():
            sizes.append(len(await asyncio.to_thread(_replicas, state)))
            await asyncio.sleep(2.0)
        return await task

    return asyncio.run(burst_and_watch()), sizes


def test_burst_grows_the_fleet_and_an_idle_minute_shrinks_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    up = _cli("dev", "up", "--state-dir", str(state), "--autoscale", "1:4", "--base-port", str(free_base(4)))
    try:
        assert up.returncode == 0, up.stderr
        info = json.loads(_cli("dev", "status", "--json", "--state-dir", str(state)).stdout)
        assert "autoscaler" in {p["name"] for p in info["parts"]}
        assert [r["phase"] for r in info["replicas"]] == ["ready"]
        result, sizes = _burst_counting_replicas(info["gateway_url"], state, agents=100, steps=6)
        print(f"replicas seen during the burst: {sizes}; calls: {result}")
        assert result["failed"] == 0 and result["ok"] == 600
        assert max(sizes) > 1, sizes
        deadline = time.monotonic() + 150.0  # an idle minute, the scale-in delay and the drains
        while time.monotonic() < deadline and len(_replicas(state)) > 1:
            time.sleep(3.0)
        final = _replicas(state)
        assert len(final) == 1 and final[0]["phase"] == "ready"
        metrics = httpx.get(info["parts"][[p["name"] for p in info["parts"]].index("autoscaler")]["address"],
                            timeout=5).text
        assert 'taskplane_autoscaler_actions_total{action="start"' in metrics
        assert 'action="drain"' in metrics
    finally:
        down = _cli("dev", "down", "--state-dir", str(state))
    assert down.returncode == 0
    assert not any(proc.port_in_use(int(str(r["url"]).rsplit(":", 1)[1])) for r in info["replicas"])


def test_a_pool_at_zero_holds_a_call_until_the_replica_it_wakes_is_up(tmp_path: Path) -> None:
    """`--autoscale 0:2`: after an idle minute the pool is at zero; a call then waits at the
    gateway (not a 503), the autoscaler sees it held and starts a replica, and the call is served."""
    state = tmp_path / "state"
    up = _cli("dev", "up", "--state-dir", str(state), "--autoscale", "0:2", "--base-port", str(free_base(4)))
    try:
        assert up.returncode == 0, up.stderr
        info = json.loads(_cli("dev", "status", "--json", "--state-dir", str(state)).stdout)
        deadline = time.monotonic() + 180.0  # the idle minute, then the cordon and drain
        while time.monotonic() < deadline and _replicas(state):
            time.sleep(3.0)
        assert _replicas(state) == [], "the idle pool did not go to zero"
        t0 = time.monotonic()
        r = httpx.post(f"{info['gateway_url']}/v1/chat/completions", timeout=120, json={
            "model": "llama-3.1-8b", "max_tokens": 8, "messages": [{"role": "user", "content": "wake up"}]})
        assert r.status_code == 200, r.text
        print(f"served after {time.monotonic() - t0:.1f} s at zero replicas")
        assert [x["phase"] for x in _replicas(state)] == ["ready"]
    finally:
        down = _cli("dev", "down", "--state-dir", str(state))
    assert down.returncode == 0


@pytest.mark.flaky(reruns=1)
def test_with_sleep_level_the_victim_sleeps_and_the_next_burst_wakes_it(tmp_path: Path) -> None:
    """`--autoscale 1:2 --sleep-level 1`: the scale-in victim is put to sleep (listed, phase
    sleeping, its process kept), and the next burst wakes that same replica instead of
    starting a new one; no call fails."""
    state = tmp_path / "state"
    up = _cli("dev", "up", "--state-dir", str(state), "--autoscale", "1:2", "--sleep-level", "1",
              "--base-port", str(free_base(4)))
    try:
        assert up.returncode == 0, up.stderr
        info = json.loads(_cli("dev", "status", "--json", "--state-dir", str(state)).stdout)
        first = asyncio.run(_burst(info["gateway_url"], agents=60, steps=4))
        assert first["failed"] == 0 and first["ok"] == 240
        deadline = time.monotonic() + 150.0
        phases: list[str] = []
        while time.monotonic() < deadline:
            reps = _replicas(state)
            phases = sorted(str(r["phase"]) for r in reps)
            if phases == ["ready", "sleeping"]:
                break
            time.sleep(2.0)
        assert phases == ["ready", "sleeping"], f"the burst did not grow and sleep back: {phases}"
        names = {str(r["name"]) for r in reps}
        sleeper = next(r for r in reps if r["phase"] == "sleeping")
        asleep = httpx.get(f"{sleeper['url']}/is_sleeping", timeout=5).json()
        assert asleep == {"is_sleeping": True}
        second = asyncio.run(_burst(info["gateway_url"], agents=60, steps=4))
        assert second["failed"] == 0 and second["ok"] == 240
        after = _replicas(state)
        assert {str(r["name"]) for r in after} == names  # the sleeper woke: no new replica was started
        metrics = httpx.get(info["parts"][[p["name"] for p in info["parts"]].index("autoscaler")]["address"],
                            timeout=5).text
        assert 'action="sleep"' in metrics and 'action="wake"' in metrics
    finally:
        down = _cli("dev", "down", "--state-dir", str(state))
    assert down.returncode == 0
