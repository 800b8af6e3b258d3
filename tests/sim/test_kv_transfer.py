"""vLLM's NixlConnector on two real sim-engine processes: the prefill replica keeps a prompt's
blocks, the decode replica pulls them over HTTP and skips their prefill."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx

from taskplane.engines.kv_events import KVEventSubscriber
from taskplane.engines.tokenize import tokenize
from taskplane.ports import free_port
from taskplane.scheduler.kv.events import BlockStored, KVEvent

from .conftest import SimProc

PRODUCER = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer"})
CONSUMER = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_consumer",
                       "kv_connector_extra_config": {"link_gbps": 10}})
PROMPT = "The agent read the repository and planned the fix step by step. " * 40 + "Go."


def _metric(text: str, name: str) -> float:
    """The sum of a metric's samples named exactly ``name`` (any labels)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _complete(client: httpx.AsyncClient, sim: SimProc, **extra: Any) -> dict[str, Any]:
    body = {"model": sim.model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, **extra}
    r = await client.post(f"{sim.url}/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def test_decode_replica_pulls_the_prefill_and_skips_it(sim_factory: Callable[..., SimProc]) -> None:
    prefill = sim_factory("--kv-transfer-config", PRODUCER)
    decode = sim_factory("--kv-transfer-config", CONSUMER)
    n_prompt = len(tokenize(PROMPT))
    full = n_prompt // 16 * 16
    assert n_prompt % 16  # (a prompt of whole blocks recomputes its last one, as in vLLM)
    stored: list[KVEvent] = []
    sub = KVEventSubscriber("d", decode.kv_endpoint, lambda _r, evs: stored.extend(evs),
                            replay_endpoint=decode.replay_endpoint, replay_from=0)
    await sub.start()
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            first = await _complete(client, prefill, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
            params = first["kv_transfer_params"]
            assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
            assert params["remote_port"] == int(prefill.url.rsplit(":", 1)[1])
            assert len(params["remote_block_ids"]) == full // 16
            assert first["usage"]["completion_tokens"] == 1
            p_metrics = (await client.get(f"{prefill.url}/metrics")).text
            assert _metric(p_metrics, "vllm:prompt_tokens_total") == n_prompt

            answer = await _complete(client, decode, kv_transfer_params=params)
            assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == full
            d_metrics = (await client.get(f"{decode.url}/metrics")).text
            assert _metric(d_metrics, "vllm:nixl_xfer_time_seconds_count") == 1
            assert _metric(d_metrics, "vllm:nixl_bytes_transferred_sum") > 0
            assert _metric(d_metrics, "vllm:external_prefix_cache_hits_total") == full
            assert _metric(d_metrics, "vllm:prefix_cache_hits_total") == full
            assert _metric(d_metrics, "vllm:nixl_num_failed_transfers_total") == 0
            by_source = {s: _metric(d_metrics, f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="{decode.model}",source="{s}"}}')
                         for s in ("local_compute", "local_cache_hit", "external_kv_transfer")}
            assert by_source == {"local_compute": n_prompt - full, "local_cache_hit": 0, "external_kv_transfer": full}
            for _ in range(100):
                if sum(len(e.block_hashes) for e in stored if isinstance(e, BlockStored)) >= full // 16:
                    break
                await asyncio.sleep(0.05)
            hashes = [h for e in stored if isinstance(e, BlockStored) for h in e.block_hashes]
            assert hashes[: full // 16] == params["remote_block_ids"]

            # a second pull of the same request finds nothing kept: counted, and the call is served
            again = await _complete(client, decode, kv_transfer_params=params)
            assert again["choices"][0]["text"] == answer["choices"][0]["text"]
            d_metrics = (await client.get(f"{decode.url}/metrics")).text
            assert _metric(d_metrics, "vllm:nixl_num_failed_transfers_total") == 1
    finally:
        await sub.stop()


async def test_unreachable_prefiller_recomputes_locally(sim_factory: Callable[..., SimProc]) -> None:
    decode = sim_factory("--kv-transfer-config", CONSUMER)
    params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "gone",
              "remote_block_ids": [1, 2], "remote_host": "127.0.0.1", "remote_port": free_port(),
              "remote_request_id": "r1", "tp_size": 1}
    async with httpx.AsyncClient(timeout=30) as client:
        answer = await _complete(client, decode, kv_transfer_params=params)
        metrics = (await client.get(f"{decode.url}/metrics")).text
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert _metric(metrics, "vllm:nixl_num_failed_transfers_total") == 1
    assert _metric(metrics, "vllm:prompt_tokens_total") == len(tokenize(PROMPT))


def test_bad_kv_transfer_config_is_refused() -> None:
    from taskplane.sim.kv_transfer import KVTransferConfig

    for text, words in (("{", "not JSON"), ('{"kv_connector": "P2pNcclConnector"}', "NixlConnector"),
                        ('{"kv_connector": "NixlConnector", "kv_role": "kv_lender"}', "kv_role")):
        try:
            KVTransferConfig.parse(text)
        except ValueError as exc:
            assert words in str(exc)
        else:
            raise AssertionError(f"{text} was accepted")
