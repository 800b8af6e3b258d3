"""The registry reads a replica's LoRA state from ``vllm:lora_requests_info`` into its
scheduler view: the adapters running and waiting there and ``--max-loras``."""

from __future__ import annotations

import asyncio

import pytest
from httpx import AsyncClient
from tp_sim_replica import sim_replica

from taskplane.config import GatewayConfig
from taskplane.engines.metrics import parse_metrics
from taskplane.engines.registry import ReplicaRegistry
from taskplane.sim.lora import LoraSettings


def _config(url: str) -> GatewayConfig:
    return GatewayConfig.model_validate({
        "auth": False, "pools": [{"model": "llama-3.1-8b", "replicas": [{"url": url, "name": "r0"}]}],
    })


def test_the_newest_label_set_is_the_current_one() -> None:
    page = (
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters=""} 100.0\n'
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="c",waiting_lora_adapters="d"} 200.0\n'
    )
    m = parse_metrics(page)
    assert (m.max_loras, m.lora_running, m.lora_waiting) == (4, frozenset({"c"}), frozenset({"d"}))
    plain = parse_metrics('vllm:num_requests_running{model_name="m"} 1\n')
    assert (plain.max_loras, plain.lora_running) == (0, frozenset())


async def test_a_scrape_puts_the_running_adapter_in_the_view() -> None:
    async with sim_replica(lora=LoraSettings(max_loras=2), lora_modules=(("chat", "/adapters/chat"),),
                           speed=0.1) as url, AsyncClient(base_url=url, timeout=30) as c:
        call = asyncio.create_task(c.post("/v1/chat/completions", json={
            "model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 40}))
        registry = ReplicaRegistry(_config(url))
        try:
            for _ in range(50):  # until the engine has admitted the call
                await asyncio.sleep(0.05)
                if "running_lora_adapters=\"chat\"" in (await c.get("/metrics")).text:
                    break
            await registry.start()
            view = registry.table().get("r0")
            assert view is not None and view.healthy
            assert (view.max_loras, view.lora_running, view.lora_waiting) == (2, frozenset({"chat"}), frozenset())
        finally:
            await registry.close()
            assert (await call).status_code == 200
    plain = ReplicaRegistry(_config("http://127.0.0.1:1")).table().get("r0")
    assert plain is not None and (plain.max_loras, plain.lora_running) == (0, frozenset())


async def test_a_scrape_reads_the_adapters_registered_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """``/v1/models``' adapters (models whose parent is the base) become the view's ``lora_served``,
    and an adapter loaded at run time joins them at the next scrape."""
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "true")
    async with sim_replica(lora=LoraSettings(max_loras=2), lora_modules=(("chat", "/adapters/chat"),)) as url, \
            AsyncClient(base_url=url, timeout=30) as c:
        registry = ReplicaRegistry(_config(url))
        try:
            await registry.start()
            view = registry.table().get("r0")
            assert view is not None and view.lora_served == frozenset({"chat"})
            r = await c.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": "/adapters/sql"})
            assert r.status_code == 200, r.text
            await registry.scrape_all()
            view = registry.table().get("r0")
            assert view is not None and view.lora_served == frozenset({"chat", "sql"})
        finally:
            await registry.close()
    plain = ReplicaRegistry(_config("http://127.0.0.1:1")).table().get("r0")
    assert plain is not None and plain.lora_served is None
