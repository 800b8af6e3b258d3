"""The dev stack with LoRA: `taskplane dev up --enable-lora` with two adapters registered on
different replicas at run time (vLLM's load API), two agents of the user's module each on
its own adapter, tasks run end to end through Temporal, Envoy and the picker: every call of a
task lands on the replica holding its adapter, the Postgres rows name the adapter, and
`taskplane report --group-by adapter` shows both."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from tp_cost_rows import cost_rows

import taskplane
from taskplane.dev.ports import free_base
from taskplane.sdk.client import connect

AGENTS_SRC = """from taskplane import agent, llm

@agent(name="{name}_a", tenant="acme", model="llama-3.1-8b", adapter="tenant-a")
async def {name}_a(who: str) -> str:
    history = [{{"role": "user", "content": "tenant a asks about " + who}}]
    for turn in range(3):
        r = await llm.chat(messages=history, max_tokens=4)
        history += [{{"role": "assistant", "content": r.text}}, {{"role": "user", "content": f"and {{turn}}?"}}]
    return "a " + who


@agent(name="{name}_b", tenant="globex", model="llama-3.1-8b", adapter="tenant-b")
async def {name}_b(who: str) -> str:
    history = [{{"role": "user", "content": "tenant b asks about " + who}}]
    for turn in range(3):
        r = await llm.chat(messages=history, max_tokens=4)
        history += [{{"role": "assistant", "content": r.text}}, {{"role": "user", "content": f"then {{turn}}?"}}]
    return "b " + who
"""


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKPLANE_") and k != "PYTHONPATH"}
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "true"  # the replicas take adapters at run time
    return subprocess.run([sys.executable, "-m", "taskplane.cli", *args], capture_output=True, text=True,
                          timeout=240, env=env, cwd=cwd)


def _served_by(gateway_url: str) -> dict[str, list[str] | None]:
    got = httpx.get(f"{gateway_url}/admin/replicas", timeout=10).json()["replicas"]
    return {r["name"]: r["lora_served"] for r in got}


def _wait_served(gateway_url: str, expected: dict[str, list[str]]) -> None:
    """Until the picker's registry has read every replica's /v1/models (it scrapes each second)."""
    deadline = time.monotonic() + 30
    while (got := _served_by(gateway_url)) != expected:
        assert time.monotonic() < deadline, got
        time.sleep(0.2)


def _lower_sessions_per_holder(state: Path, config: Path, value: float) -> None:
    from taskplane.dev import stack
    from taskplane.dev.processes import stop_pid
    from taskplane.scheduler.presets import PRESETS

    cfg = yaml.safe_load(config.read_text())
    cfg["scheduler"]["scorers"] = [
        {**s, "params": {**s["params"], "sessions_per_holder": value}} if s["type"] == "adapter-residency" else s
        for s in PRESETS["taskplane"].scorers]
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    gateway = next(p for p in json.loads((state / "stack.json").read_text())["parts"] if p["name"] == "gateway")
    stop_pid(gateway["pid"])
    stack.restart_part(state, "gateway")


def test_two_adapters_two_agents_on_the_dev_stack(tmp_path: Path) -> None:
    name = f"loraagents_{os.urandom(3).hex()}"
    (tmp_path / f"{name}.py").write_text(AGENTS_SRC.format(name=name))
    state = tmp_path / ".taskplane"
    shared = tmp_path / "adapters" / "shared"
    up = _cli(tmp_path, "dev", "up", "--state-dir", str(state), "--replicas", "3", "--base-port", str(free_base(3)),
              "--module", name, "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "2",
              "--lora-modules", f"shared={shared}")
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        info: dict[str, Any] = json.loads(_cli(tmp_path, "dev", "status", "--json", "--state-dir", str(state)).stdout)
        assert info["lora"]["max_loras"] == 2 and info["lora"]["modules"] == [{"name": "shared", "path": str(shared)}]
        urls = {r["name"]: r["url"] for r in info["replicas"]}
        # as an operator would: tenant-a's adapter on replica-0, tenant-b's on replica-1, neither on replica-2
        for replica, adapter in (("replica-0", "tenant-a"), ("replica-1", "tenant-b")):
            r = httpx.post(f"{urls[replica]}/v1/load_lora_adapter", timeout=10,
                           json={"lora_name": adapter, "lora_path": str(tmp_path / "adapters" / adapter)})
            assert r.status_code == 200, r.text
        holding = {"tenant-a": "replica-0", "tenant-b": "replica-1"}
        for replica, url in urls.items():
            cards = {m["id"]: m.get("parent") for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
            mine = {a for a, r in holding.items() if r == replica}
            assert {m for m, parent in cards.items() if parent} == {"shared", *mine}, (replica, cards)
        _wait_served(info["gateway_url"], {"replica-0": ["shared", "tenant-a"], "replica-1": ["shared", "tenant-b"],
                                           "replica-2": ["shared"]})

        sys.path.insert(0, str(tmp_path))
        try:
            module = __import__(name)
        finally:
            sys.path.remove(str(tmp_path))
        tasks = {f"{name}-{who}-{i}": (who, getattr(module, f"{name}_{who}")) for who in ("a", "b") for i in range(3)}

        async def run_all() -> list[str]:
            client = await connect(info["temporal_address"])
            handles = [await taskplane.submit(fn, tid, client=client, task_id=tid) for tid, (_, fn) in tasks.items()]
            return [str(x) for x in await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)]

        assert asyncio.run(run_all()) == [f"{who} {tid}" for tid, (who, _) in tasks.items()]
        rows = asyncio.run(cost_rows(info["database_url"], list(tasks), 3 * len(tasks)))
        assert len(rows) == 3 * len(tasks)  # one attempt per call: none went where its adapter is not
        for row in rows:
            adapter = f"tenant-{tasks[row['task_id']][0]}"
            assert (row["adapter"], row["replica"], row["outcome"]) == (adapter, holding[adapter], "success"), dict(row)
            assert row["model_requested"] == "llama-3.1-8b"

        # an operator who wants a hot adapter on a second replica sooner lowers the residency
        # rule's sessions per holder in the gateway's YAML and restarts the gateway
        _lower_sessions_per_holder(state, Path(info["gateway_config"]), 0.05)
        # demand: more of tenant a's sessions than one replica is planned to absorb; the picker's
        # adapter loader registers tenant-a on another (idle) replica with vLLM's load API
        more = {f"{name}-a-more-{i}": ("a", module.__dict__[f"{name}_a"]) for i in range(6)}

        async def run_more() -> None:
            client = await connect(info["temporal_address"])
            handles = [await taskplane.submit(fn, tid, client=client, task_id=tid) for tid, (_, fn) in more.items()]
            await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)

        asyncio.run(run_more())
        deadline = time.monotonic() + 30
        while not [r for r, v in _served_by(info["gateway_url"]).items() if r != "replica-0" and "tenant-a" in (v or [])]:
            assert time.monotonic() < deadline, _served_by(info["gateway_url"])
            time.sleep(0.5)
        served = _served_by(info["gateway_url"])
        for replica, url in urls.items():  # the replicas' own word for it
            ids = {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
            assert ("tenant-a" in ids) == ("tenant-a" in (served[replica] or [])), (replica, ids)
        assert "adapter_preloaded" in (state / "logs" / "gateway.log").read_text()
        for row in asyncio.run(cost_rows(info["database_url"], list(more), 3 * len(more))):
            assert row["adapter"] == "tenant-a" and row["outcome"] == "success", dict(row)
            assert "tenant-a" in (served[row["replica"]] or []), dict(row)

        report = _cli(tmp_path, "report", "--group-by", "adapter", "--format", "json", "--state-dir", str(state),
                      "--out", str(tmp_path / "report.json"))
        assert report.returncode == 0, report.stderr[-2000:]
        groups = {g["key"]: g for g in json.loads((tmp_path / "report.json").read_text())["groups"]}
        for adapter in ("tenant-a", "tenant-b"):
            assert groups[adapter]["tasks_succeeded"] == (9 if adapter == "tenant-a" else 3) and groups[adapter]["cost_per_successful_task_usd"] > 0
    finally:
        down = _cli(tmp_path, "dev", "down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr
