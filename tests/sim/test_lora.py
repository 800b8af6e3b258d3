"""LoRA adapters on the simulated replica: the engine's batch limit, loads and slowdown, and
vLLM's LoRA API (models, runtime load/unload, the lora_requests_info metric, KV apart)."""

from __future__ import annotations

import pytest
from httpx import AsyncClient
from prometheus_client.parser import text_string_to_metric_families
from tp_sim_replica import sim_replica
from typer.testing import CliRunner

from taskplane.cli import app
from taskplane.scheduler.kv.events import BlockStored
from taskplane.sim.engine import EngineConfig, KVEvents, SimEngine, SimRequest
from taskplane.sim.lora import Adapters, LoraError, LoraSettings, parse_lora_modules
from taskplane.sim.lora_api import RUNTIME_UPDATES_ENV

from .test_engine_model import drive, finished


def _engine(**lora: object) -> SimEngine:
    e = SimEngine(EngineConfig(gpu="h100", kv_blocks=4000, lora=LoraSettings(**lora)))  # type: ignore[arg-type]
    assert e.adapters is not None
    for name in ("a", "b", "c"):
        e.adapters.register(name, f"/adapters/{name}")
    return e


def _req(rid: str, adapter: str | None, prompt: int = 512, out: int = 64) -> SimRequest:
    return SimRequest(rid, prompt, out, [hash((rid, i)) for i in range(prompt // 16)], adapter=adapter)


def test_a_batch_mixes_at_most_max_loras_adapters_and_later_requests_go_past_a_skipped_one() -> None:
    e = _engine(max_loras=1)
    done = finished(drive(e, [(0.0, _req("a1", "a")), (0.0, _req("b1", "b")), (0.0, _req("a2", "a"))]))
    # b1 waits for adapter a's requests to leave the batch; a2, behind it, does not wait for b1
    assert done["a2"].admitted == done["a1"].admitted == 0.0
    assert done["b1"].admitted >= max(done["a1"].time, done["a2"].time)


def test_two_slots_serve_two_adapters_at_once() -> None:
    e = _engine(max_loras=2)
    done = finished(drive(e, [(0.0, _req("a1", "a")), (0.0, _req("b1", "b"))]))
    assert done["a1"].admitted == done["b1"].admitted == 0.0


def test_a_cold_adapter_costs_its_disk_load_a_host_copy_only_the_gpu_copy() -> None:
    settings = {"max_loras": 1, "max_cpu_loras": 2, "disk_load_s": 0.5, "gpu_load_s": 0.01}
    base = finished(drive(SimEngine(EngineConfig(gpu="h100", kv_blocks=4000)), [(0.0, _req("x", None))]))["x"]
    e = _engine(**settings)
    cold = finished(drive(e, [(0.0, _req("a1", "a"))]))["a1"]
    assert cold.first_token - base.first_token >= 0.5  # read from disk, then copied in
    # b evicts a from the only GPU slot; a stays in host memory (two CPU slots)
    finished(drive(e, [(10.0, _req("b1", "b"))]))
    assert e.adapters is not None and e.adapters.on_gpu == ["b"] and set(e.adapters.in_cpu) == {"a", "b"}
    warm = finished(drive(e, [(20.0, _req("a2", "a"))]))["a2"]
    assert 0.0 < (warm.first_token - 20.0) - (base.first_token - 0.0) < 0.1  # only the host -> GPU copy
    assert e.adapters.loads_from_disk == 2 and e.adapters.loads_to_gpu == 3


def test_steps_with_more_adapters_are_slower() -> None:
    one = _engine(max_loras=3)
    t_one = max(f.time for f in finished(drive(one, [(0.0, _req(f"r{i}", "a", out=200)) for i in range(3)])).values())
    three = _engine(max_loras=3)
    t_three = max(f.time for f in finished(drive(three, [(0.0, _req(f"r{i}", n, out=200))
                                                         for i, n in enumerate("abc")])).values())
    base = SimEngine(EngineConfig(gpu="h100", kv_blocks=4000))
    t_base = max(f.time for f in finished(drive(base, [(0.0, _req(f"r{i}", None, out=200)) for i in range(3)])).values())
    assert t_base < t_one < t_three


def test_the_lora_api_refuses_what_vllm_refuses() -> None:
    ad = Adapters(LoraSettings())
    ad.register("a", "/p")
    with pytest.raises(LoraError, match="already been loaded") as exc:
        ad.register("a", "/q")
    assert exc.value.status == 400
    with pytest.raises(LoraError, match="cannot be found") as exc:
        ad.unregister("zzz")
    assert exc.value.status == 404
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LoraSettings(max_loras=4, max_cpu_loras=2)
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_lora_modules(["no-path"])
    assert parse_lora_modules(["sql=/w/sql"]) == (("sql", "/w/sql"),)


async def test_the_replica_serves_adapters_as_models_and_loads_them_at_run_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUNTIME_UPDATES_ENV, "true")
    async with sim_replica(lora=LoraSettings(max_loras=2), lora_modules=(("sql", "/adapters/sql"),),
                           speed=50.0) as url, AsyncClient(base_url=url, timeout=30) as c:
        models = (await c.get("/v1/models")).json()["data"]
        assert [(m["id"], m["parent"]) for m in models] == [("llama-3.1-8b", None), ("sql", "llama-3.1-8b")]
        unknown = await c.post("/v1/chat/completions", json={"model": "chat", "messages": [{"role": "user",
                                                                                           "content": "hi"}]})
        assert unknown.status_code == 404 and "does not exist" in unknown.text
        r = await c.post("/v1/load_lora_adapter", json={"lora_name": "chat", "lora_path": "/adapters/chat"})
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'chat' added successfully."
        again = await c.post("/v1/load_lora_adapter", json={"lora_name": "chat", "lora_path": "/adapters/chat"})
        assert again.status_code == 400 and "already been loaded" in again.text
        prompt = [{"role": "user", "content": "the same long prompt " * 40}]
        first = await c.post("/v1/chat/completions", json={"model": "chat", "messages": prompt, "max_tokens": 4})
        assert first.status_code == 200 and first.json()["model"] == "chat"
        # the same prompt under another adapter or the base model finds none of chat's blocks
        for model in ("sql", "llama-3.1-8b"):
            other = await c.post("/v1/chat/completions", json={"model": model, "messages": prompt, "max_tokens": 4})
            assert other.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0
        warm = await c.post("/v1/chat/completions", json={"model": "chat", "messages": prompt, "max_tokens": 4})
        assert warm.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        families = text_string_to_metric_families((await c.get("/metrics")).text)
        info = [s for f in families for s in f.samples if s.name == "vllm:lora_requests_info"]
        assert len(info) == 1 and info[0].labels["max_lora"] == "2" and info[0].value > 0
        gone = await c.post("/v1/unload_lora_adapter", json={"lora_name": "chat"})
        assert gone.status_code == 200 and "removed successfully" in gone.text
        assert (await c.post("/v1/unload_lora_adapter", json={"lora_name": "chat"})).status_code == 404
        assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == ["llama-3.1-8b", "sql"]


async def test_without_the_runtime_flag_the_load_endpoint_is_not_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUNTIME_UPDATES_ENV, raising=False)
    async with sim_replica(lora=LoraSettings()) as url, AsyncClient(base_url=url, timeout=30) as c:
        r = await c.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/x"})
        assert r.status_code == 404


def test_an_adapters_blocks_are_announced_with_its_id_and_name() -> None:
    e = _engine(max_loras=1)
    events = drive(e, [(0.0, _req("a1", "a")), (0.0, _req("x", None))])
    stored = [ev for batch in events if isinstance(batch, KVEvents) for ev in batch.events
              if isinstance(ev, BlockStored)]
    assert e.adapters is not None
    mine = e.adapters.registered["a"]
    assert {(ev.lora_id, ev.lora_name) for ev in stored} == {(mine.int_id, "a"), (None, None)}


def test_the_command_line_wants_enable_lora_for_lora_modules() -> None:
    result = CliRunner().invoke(app, ["sim-engine", "--port", "1", "--lora-modules", "sql=/w/sql"])
    assert result.exit_code != 0 and "--enable-lora" in result.output
    result = CliRunner().invoke(app, ["sim-engine", "--port", "1", "--enable-lora", "--lora-modules", "sql"])
    assert result.exit_code != 0 and "NAME=PATH" in result.output


def test_a_preload_reads_the_host_copy_ahead_and_holds_only_the_next_step() -> None:
    """``/v1/load_lora_adapter``'s read ahead of demand: the first request then pays only the
    GPU copy, a request arriving during the read waits for the rest of it, and the loads on
    the request path do not count it."""
    settings = {"max_loras": 1, "max_cpu_loras": 2, "disk_load_s": 0.5, "gpu_load_s": 0.01}
    base = finished(drive(SimEngine(EngineConfig(gpu="h100", kv_blocks=4000)), [(0.0, _req("x", None))]))["x"]
    e = _engine(**settings)
    assert e.adapters is not None
    assert e.adapters.preload("a", 0.0) and not e.adapters.preload("a", 0.0)  # already there
    assert not e.adapters.preload("unknown", 0.0)
    warm = finished(drive(e, [(5.0, _req("a1", "a"))]))["a1"]
    assert 0.0 < (warm.first_token - 5.0) - base.first_token < 0.1  # the read was over: only the GPU copy
    assert (e.adapters.loads_from_disk, e.adapters.loads_to_gpu, e.adapters.preloads) == (0, 1, 1)
    assert e.adapters.preload("b", 10.0)
    during = finished(drive(e, [(10.2, _req("b1", "b"))]))["b1"]
    assert (during.first_token - 10.2) - base.first_token >= 0.3 - 1e-9  # waits out the read (0.5 - 0.2)
