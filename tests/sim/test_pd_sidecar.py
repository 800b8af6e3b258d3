"""``taskplane pd-sidecar`` in front of a decode sim-engine, with a prefill sim-engine: real
processes on loopback (the prefill runs there, the decode engine pulls its KV), the stream
passes through, a call without the header is forwarded unchanged, a dead prefiller falls back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from taskplane.engines.tokenize import chat_tokens
from taskplane.ports import free_port

from .conftest import SimProc
from .test_kv_transfer import CONSUMER, PRODUCER, _metric

MESSAGES = [{"role": "user", "content": "Summarise the incident log and propose a fix. " * 60}]


@pytest.fixture
def sidecar_factory() -> Iterator[Callable[[str], str]]:
    started: list[subprocess.Popen[bytes]] = []

    def make(decoder_url: str) -> str:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "taskplane.cli", "pd-sidecar", "--decoder-url", decoder_url,
                                 "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "exited"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("pd-sidecar did not come up")

    yield make
    for p in started:
        p.terminate()
        p.wait(timeout=10)


def _hp(sim: SimProc) -> str:
    return sim.url.split("://", 1)[1]


def test_sidecar_prefills_remotely_streams_forwards_and_falls_back(
    sim_factory: Callable[..., SimProc], sidecar_factory: Callable[[str], str]
) -> None:
    prefill = sim_factory("--kv-transfer-config", PRODUCER)
    decode = sim_factory("--kv-transfer-config", CONSUMER)
    side = sidecar_factory(decode.url)
    n_prompt = len(chat_tokens(MESSAGES))
    body = {"model": decode.model, "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    with httpx.Client(timeout=30) as c:
        # disaggregated, streamed: the prefill replica computes the prompt, the stream comes from the decoder
        with c.stream("POST", f"{side}/v1/chat/completions", json={**body, "stream": True},
                      headers={"x-prefiller-host-port": _hp(prefill)}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert any(json.loads(e[6:])["choices"] and json.loads(e[6:])["choices"][0]["delta"].get("content")
                   for e in events[:-1])
        p_metrics, d_metrics = c.get(f"{prefill.url}/metrics").text, c.get(f"{side}/metrics").text
        assert _metric(p_metrics, "vllm:prompt_tokens_total") == n_prompt
        assert _metric(p_metrics, "vllm:generation_tokens_total") == 1
        assert _metric(d_metrics, "vllm:nixl_xfer_time_seconds_count") == 1
        pulled = _metric(d_metrics, "vllm:external_prefix_cache_hits_total")
        assert pulled == n_prompt // 16 * 16
        assert _metric(d_metrics, "vllm:prefix_cache_hits_total") >= min(pulled, (n_prompt - 1) // 16 * 16)
        assert c.get(f"{side}/pd-sidecar/stats").json()["disaggregated"] == 1

        # no header: forwarded unchanged, nothing pulled
        other = {**body, "messages": [{"role": "user", "content": "A short question."}]}
        r2 = c.post(f"{side}/v1/chat/completions", json=other)
        assert r2.status_code == 200 and "kv_transfer_params" not in r2.json()
        stats = c.get(f"{side}/pd-sidecar/stats").json()
        assert stats["forwarded"] == 1 and stats["disaggregated"] == 1

        # a dead prefiller: logged, counted, the decode engine prefills locally
        third = {**body, "messages": [{"role": "user", "content": "Another long task description. " * 50}]}
        r3 = c.post(f"{side}/v1/chat/completions", json=third, headers={"x-prefiller-host-port": f"127.0.0.1:{free_port()}"})
        assert r3.status_code == 200 and r3.json()["choices"][0]["message"]["content"]
        stats = c.get(f"{side}/pd-sidecar/stats").json()
        assert stats["prefill_failed"] == 1 and "ConnectError" in stats["last_error"]
        assert _metric(c.get(f"{side}/metrics").text, "vllm:nixl_xfer_time_seconds_count") == 1
