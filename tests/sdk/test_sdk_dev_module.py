"""`taskplane dev up --module M` as a user runs it in their project directory: the dev worker
serves their agents (imported from that directory), a second `up --module N` adds more
without restarting the rest of the stack, and `taskplane run`-free submits just work."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import taskplane
from taskplane.dev.ports import free_base
from taskplane.sdk.client import connect

AGENT_SRC = """from taskplane import agent, llm

@agent(name="{name}", tenant="acme")
async def {name}(who: str) -> str:
    r = await llm.chat(model="llama-3.1-8b", messages=[{{"role": "user", "content": who}}], max_tokens=4)
    return "{name} " + who
"""


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKPLANE_") and k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "taskplane.cli", *args], capture_output=True, text=True,
                          timeout=240, env=env, cwd=cwd)


def _load(tmp: Path, name: str):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(tmp))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(tmp))


def test_dev_up_module_serves_the_users_agents_and_adds_more(tmp_path: Path) -> None:
    suffix = os.urandom(3).hex()
    first, second = f"devmod_a_{suffix}", f"devmod_b_{suffix}"
    for name in (first, second):
        (tmp_path / f"{name}.py").write_text(AGENT_SRC.format(name=name))
    state = tmp_path / ".taskplane"
    base = str(free_base(1))
    up = _cli(tmp_path, "dev", "up", "--state-dir", str(state), "--replicas", "1", "--base-port", base,
              "--module", first)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        info = json.loads(_cli(tmp_path, "dev", "status", "--json", "--state-dir", str(state)).stdout)
        gateway_pid = next(p["pid"] for p in info["parts"] if p["name"] == "gateway")

        async def run(name: str) -> str:
            client = await connect(info["temporal_address"])
            handle = await taskplane.submit(getattr(_load(tmp_path, name), name), "ada", client=client)
            return str(await asyncio.wait_for(handle.result(), timeout=90))

        assert asyncio.run(run(first)) == f"{first} ada"
        again = _cli(tmp_path, "dev", "up", "--state-dir", str(state), "--base-port", base, "--module", second)
        assert again.returncode == 0, again.stderr[-3000:]
        info2 = json.loads(_cli(tmp_path, "dev", "status", "--json", "--state-dir", str(state)).stdout)
        assert next(p["pid"] for p in info2["parts"] if p["name"] == "gateway") == gateway_pid  # only the worker moved
        assert all(p["alive"] for p in info2["parts"])
        assert asyncio.run(run(second)) == f"{second} ada"
        assert asyncio.run(run(first)) == f"{first} ada"  # still served
    finally:
        down = _cli(tmp_path, "dev", "down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr
