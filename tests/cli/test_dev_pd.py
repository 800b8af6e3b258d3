"""Prefill/decode disaggregation on the live dev stack: `taskplane dev up --pd 1:2` (Temporal,
Postgres, one prefill sim replica, two decode ones behind pd-sidecars, Envoy and the picker).
A long new prompt is prefilled on the prefill replica (its /metrics shows the prompt), the
decode replica pulls the KV (its /metrics shows the transfer and no local prefill of those
tokens) and the answer comes back through Envoy (and the Python data plane); a short call stays on its decode replica; with
the prefill replica dead, calls are still answered, prefilled where they decode."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tp_cost_rows import cost_rows

from taskplane.dev.ports import free_base


def _cli(cwd: Path, *args: str, data_plane: str = "envoy") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if (not k.startswith("TASKPLANE_") or k == "TASKPLANE_VLLM_VENV") and k != "PYTHONPATH"}
    env["TASKPLANE_DATA_PLANE"] = data_plane  # the gateway `dev up` starts reads it
    return subprocess.run([sys.executable, "-m", "taskplane.cli", *args], capture_output=True, text=True,
                          timeout=240, env=env, cwd=cwd)


def _metrics(url: str) -> dict[str, float]:
    """The unlabelled sum of each sample of a replica's /metrics."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split("{", 1)[0].split(" ", 1)[0], float(line.rsplit(" ", 1)[1])
            out[name] = out.get(name, 0.0) + value
    return out


def _chat(gateway: str, content: str, task: str, body: dict[str, Any] | None = None, **headers: str) -> httpx.Response:
    r = httpx.post(f"{gateway}/v1/chat/completions", timeout=60, headers={"X-Taskplane-Task-Id": task, **headers},
                   json={"model": "llama-3.1-8b", "messages": [{"role": "user", "content": content}], "max_tokens": 6,
                         **(body or {})})
    assert r.status_code == 200, r.text
    return r


def _long(topic: str) -> str:
    return f"Read the {topic} logs, find the failing step and propose a patch for it. " * 45


@pytest.mark.parametrize("data_plane", ["envoy", "python"])
def test_dev_stack_disaggregates_long_prompts(tmp_path: Path, data_plane: str) -> None:
    state = tmp_path / ".taskplane"
    up = _cli(tmp_path, "dev", "up", "--state-dir", str(state), "--base-port", str(free_base(5)), "--pd", "1:2",
              data_plane=data_plane)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        info: dict[str, Any] = json.loads(_cli(tmp_path, "dev", "status", "--json", "--state-dir", str(state)).stdout)
        assert info["pd"] == {"prefill": 1, "decode": 2, "policy": "taskplane-pd"}
        gateway = info["gateway_url"]
        roles = {r["name"]: r["role"] for r in httpx.get(f"{gateway}/admin/replicas", timeout=10).json()["replicas"]}
        assert roles == {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}
        by_name = {r["name"]: r for r in info["replicas"]}
        prefill_url = by_name["prefill-0"]["url"]
        decoders = {n: r for n, r in by_name.items() if r["role"] == "decode"}
        assert all(r["url"] != r["engine_url"] for r in decoders.values())  # the picker routes to the sidecars

        # a long new prompt: prefilled on the prefill replica, decoded (and answered) on a decode one
        r = _chat(gateway, _long("deploy"), "pd-long-1")
        served = r.headers["x-taskplane-replica"]
        assert served in decoders, served
        n_prompt = r.json()["usage"]["prompt_tokens"]
        assert n_prompt > 2000
        pre = _metrics(prefill_url)
        assert pre["vllm:prompt_tokens_total"] == n_prompt and pre["vllm:generation_tokens_total"] == 1
        dec = _metrics(decoders[served]["engine_url"])
        assert dec["vllm:nixl_xfer_time_seconds_count"] == 1 and dec["vllm:nixl_bytes_transferred_sum"] > 0
        pulled = dec["vllm:external_prefix_cache_hits_total"]
        assert pulled == n_prompt // 16 * 16
        # the decode replica computed only the tokens it did not pull (its last block at most, as vLLM)
        assert dec["vllm:prompt_tokens_total"] - dec["vllm:prefix_cache_hits_total"] <= 16
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= pulled - 16
        side = httpx.get(f"{decoders[served]['url']}/pd-sidecar/stats", timeout=10).json()
        assert side["disaggregated"] == 1 and side["prefill_failed"] == 0
        other = next(n for n in decoders if n != served)
        assert _metrics(decoders[other]["engine_url"]).get("vllm:nixl_xfer_time_seconds_count", 0) == 0

        # a short call is not disaggregated: the prefill replica sees nothing more (and a
        # client cannot name a prefiller itself, nor KV to pull: its header and params are removed)
        pull = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": 9, "remote_engine_id": "x",
                "remote_request_id": "y", "remote_block_ids": [1]}
        short = _chat(gateway, "Say hello.", "pd-short-1", {"kv_transfer_params": pull},
                      **{"x-prefiller-host-port": "127.0.0.1:9"})
        assert short.json()["choices"][0]["message"]["content"]
        assert _metrics(prefill_url)["vllm:prompt_tokens_total"] == n_prompt
        forwarded = sum(httpx.get(f"{d['url']}/pd-sidecar/stats", timeout=10).json()["forwarded"]
                        for d in decoders.values())
        assert forwarded == 1, [httpx.get(f"{d['url']}/pd-sidecar/stats", timeout=10).json() for d in decoders.values()]
        assert sum(httpx.get(f"{d['url']}/pd-sidecar/stats", timeout=10).json()["prefill_failed"]
                   for d in decoders.values()) == 0
        assert sum(_metrics(d["engine_url"]).get("vllm:nixl_num_failed_transfers_total", 0) for d in decoders.values()) == 0

        # the rows name the replica that computed each prompt, and charge the long call's
        # share of the prefill GPU beside the decode one's (at most its duration on each)
        rows = {r["task_id"]: r for r in asyncio.run(cost_rows(info["database_url"], ["pd-long-1", "pd-short-1"], 2))}
        long_row, short_row = rows["pd-long-1"], rows["pd-short-1"]
        assert (long_row["replica"], long_row["prefill_replica"]) == (served, "prefill-0"), dict(long_row)
        assert long_row["gpu_seconds"] > long_row["total_ms"] / 1000.0, dict(long_row)
        assert short_row["prefill_replica"] is None and short_row["gpu_seconds"] <= short_row["total_ms"] / 1000.0

        # every call's place on both replicas was given back (the prefill replica's too)
        inflight = {r["name"]: r["inflight"] for r in httpx.get(f"{gateway}/admin/replicas", timeout=10).json()["replicas"]}
        assert inflight == {"prefill-0": 0, "decode-0": 0, "decode-1": 0}

        # the prefill replica dies: long calls are still answered, prefilled on their decode replica
        pid = next(p["pid"] for p in info["parts"] if p["name"] == "prefill-0")
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        before = {n: _metrics(d["engine_url"]) for n, d in decoders.items()}
        for i in range(3):
            again = _chat(gateway, _long(f"billing-{i}"), f"pd-dead-{i}")
            assert again.headers["x-taskplane-replica"] in decoders
        after = {n: _metrics(d["engine_url"]) for n, d in decoders.items()}
        for n in decoders:  # no transfer: every prompt computed where it decoded
            assert after[n].get("vllm:nixl_xfer_time_seconds_count", 0) == before[n].get("vllm:nixl_xfer_time_seconds_count", 0)
            assert after[n].get("vllm:external_prefix_cache_hits_total", 0) == before[n].get("vllm:external_prefix_cache_hits_total", 0)
        computed = sum(after[n]["vllm:prompt_tokens_total"] - before[n]["vllm:prompt_tokens_total"] for n in decoders)
        assert computed > 3 * 2000
    finally:
        down = _cli(tmp_path, "dev", "down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr


def test_dev_up_refuses_bad_pd_flags(tmp_path: Path) -> None:
    state = str(tmp_path / ".taskplane")
    for args, words in ((["--pd", "2"], "--pd wants P:D"), (["--pd", "0:1"], "--pd wants P:D"),
                        (["--pd-policy", "llm-d-pd"], "--pd-policy needs --pd"),
                        (["--pd", "1:1", "--autoscale", "1:2"], "drop --autoscale")):
        got = _cli(tmp_path, "dev", "up", "--state-dir", state, *args)
        assert got.returncode == 2 and words in got.stderr, (args, got.stderr)
    assert not (tmp_path / ".taskplane" / "stack.json").exists()
