"""The gateway in front of real vLLM replicas: a session stays on one replica and hits its
cache (by the replica's own counters), the gateway hears the replicas' real KV events, and
a killed replica's session moves to the other replica and completes.

This module starts its own two replicas (one of them is killed at the end) and a real
``taskplane gateway`` process.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from vllm_helpers import MODEL, EventLog, metrics, subscribe, unique_text, wait_for

from taskplane.dev import processes as proc
from taskplane.engines.tokenize import chat_tokens
from taskplane.engines.vllm_launcher import (
    BLOCK_SIZE,
    VllmOptions,
    VllmReplica,
    kill_replica,
    start_replicas,
    stop_replicas,
)
from taskplane.ports import free_port

GATEWAY_BLOCKS = 64
"""A roomier cache than the eviction tests use: sessions here must stay resident."""


@dataclass
class Stack:
    replicas: list[VllmReplica]
    gateway_url: str
    log: Path

    def replica(self, name: str) -> VllmReplica:
        return next(r for r in self.replicas if f"replica-{r.index}" == name)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("vllm-gateway")
    replicas = start_replicas(work, 2, VllmOptions(model_name=MODEL, num_blocks=GATEWAY_BLOCKS))
    pid = None
    try:
        config = {
            "pools": [{"model": MODEL, "max_context_tokens": (GATEWAY_BLOCKS - 1) * BLOCK_SIZE, "replicas": [
                {"url": r.url, "gpu": "cpu", "name": f"replica-{r.index}", "kv_events": r.kv_events,
                 "kv_replay": r.replay, "block_size": BLOCK_SIZE, "kv_blocks": GATEWAY_BLOCKS}
                for r in replicas]}],
            "tenants": [{"id": "default", "max_priority": "interactive"}],
            "auth": False,
            "limits": {"request_timeout_s": 300.0},
            "outbox_dir": str(work / "outbox"),
        }
        cfg = work / "gateway.yaml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        log = work / "gateway.log"
        pid = proc.spawn([sys.executable, "-m", "taskplane.cli", "gateway", "--config", str(cfg), "--port", str(port)],
                         log, env={"TASKPLANE_STATE_DIR": str(work)})
        url = f"http://127.0.0.1:{port}"
        proc.wait_until(proc.http_ok(f"{url}/healthz"), "gateway", 60, pid, log)
        yield Stack(replicas, url, log)
    finally:
        proc.stop_pid(pid)
        stop_replicas(replicas)


def _turn(client: httpx.Client, stack: Stack, session: str, messages: list[dict[str, str]]) -> httpx.Response:
    resp = client.post(f"{stack.gateway_url}/v1/chat/completions",
                       headers={"X-Taskplane-Session-Id": session, "X-Taskplane-Task-Id": session},
                       json={"model": MODEL, "messages": messages, "max_tokens": 16})
    assert resp.status_code == 200, resp.text
    messages.append({"role": "assistant", "content": resp.json()["choices"][0]["message"]["content"]})
    return resp


def test_session_stays_on_one_replica_and_hits_its_cache(stack: Stack) -> None:
    session = unique_text(12)
    messages = [{"role": "system", "content": unique_text(300)}, {"role": "user", "content": unique_text(200)}]
    with httpx.Client(timeout=300.0) as client:
        before = {f"replica-{r.index}": metrics(client, r).prefix_cache_hits for r in stack.replicas}
        placed, cached = [], []
        previous: list[int] = []
        for turn in range(4):
            prompt = chat_tokens(messages)
            resp = _turn(client, stack, session, messages)
            placed.append(resp.headers["X-Taskplane-Replica"])
            cached.append(int(resp.headers["X-Taskplane-Cached-Tokens"]))
            if turn:
                # At least every full block of the previous turn's prompt was served from cache.
                assert cached[-1] >= len(previous) // BLOCK_SIZE * BLOCK_SIZE > 0
            previous = prompt
            messages.append({"role": "user", "content": unique_text(150)})
        assert len(set(placed)) == 1, placed
        home = stack.replica(placed[0])
        gained = metrics(client, home).prefix_cache_hits - before[placed[0]]
    # The gateway's cached-token figures are the replica's own counters, call by call.
    assert gained == sum(cached)


async def test_gateway_index_mirrors_real_kv_events(stack: Stack) -> None:
    """The gateway's index holds, per replica, exactly the blocks the replica announced as
    stored and not since removed (counted here from a replay of the same event stream)."""
    logs = {f"replica-{r.index}": EventLog() for r in stack.replicas}
    subs = [await subscribe(r, logs[f"replica-{r.index}"], replay_from=0) for r in stack.replicas]
    try:
        async with httpx.AsyncClient(timeout=300.0) as client:
            for r in stack.replicas:  # something new on each replica, which also triggers the replay
                resp = await client.post(f"{r.url}/v1/completions",
                                         json={"model": MODEL, "prompt": unique_text(300), "max_tokens": 1})
                assert resp.status_code == 200, resp.text

            async def gateway_view() -> dict[str, dict]:
                admin = (await client.get(f"{stack.gateway_url}/admin/replicas")).json()["replicas"]
                return {a["name"]: a for a in admin}

            for log in logs.values():
                assert await wait_for(lambda log=log: len(log.live()) > 0)
            view: dict[str, dict] = {}
            for _ in range(50):
                view = await gateway_view()
                if all(view[n].get("kv_index_blocks") == len(log.live()) for n, log in logs.items()):
                    break
                await asyncio.sleep(0.1)
    finally:
        for sub in subs:
            await sub.stop()
    for name, log in logs.items():
        assert view[name]["kv_events_live"] is True, "the gateway did not subscribe to the replica's KV events"
        assert view[name]["kv_index_in_sync"] is True
        assert view[name]["kv_index_blocks"] == len(log.live()) > 0


def test_killed_replicas_session_moves_and_completes(stack: Stack) -> None:
    """Runs last in this module: it kills a replica for good."""
    session = unique_text(12)
    messages = [{"role": "system", "content": unique_text(300)}, {"role": "user", "content": unique_text(100)}]
    with httpx.Client(timeout=300.0) as client:
        first = _turn(client, stack, session, messages).headers["X-Taskplane-Replica"]
        kill_replica(stack.replica(first))
        messages.append({"role": "user", "content": unique_text(100)})
        moved = _turn(client, stack, session, messages)
        assert moved.headers["X-Taskplane-Replica"] != first
        messages.append({"role": "user", "content": unique_text(100)})
        settled = _turn(client, stack, session, messages)
    # The session settled on its new replica and hits the cache it built there.
    assert settled.headers["X-Taskplane-Replica"] == moved.headers["X-Taskplane-Replica"]
    assert int(settled.headers["X-Taskplane-Cached-Tokens"]) >= BLOCK_SIZE
