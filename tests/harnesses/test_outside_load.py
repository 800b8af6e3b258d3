"""The outside-harness bench's own parts: the timed trace it hands vLLM's load generator
keeps the sessions' prefix sharing, and its round-robin Envoy is a config Envoy accepts."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import yaml

from benchmarks.outside_load import CHUNK, generator_args, round_robin_bootstrap, timed_trace
from taskplane.bench.agent_sessions import workload
from taskplane.dev.local import LocalReplica
from taskplane.epp.envoy_process import envoy_binary


def test_timed_trace_keeps_each_sessions_prefix() -> None:
    wl = workload(6, 1, "phases", 1.0, 3.0)
    lines = timed_trace(wl)
    assert len(lines) == wl.num_calls
    assert [x["timestamp"] for x in lines] == sorted(x["timestamp"] for x in lines)
    for line in lines:
        assert len(line["hash_ids"]) == math.ceil(line["input_length"] / CHUNK)
    task = next(t for t in wl.tasks if len(t.calls) >= 2)
    first, second = (len(c.prompt.encode()) for c in task.calls[:2])
    by_len = {x["input_length"]: x["hash_ids"] for x in lines}
    full = first // CHUNK
    assert by_len[second][:full] == by_len[first][:full]  # the second call extends the first
    other = next(t for t in wl.tasks if t.agent != task.agent)
    assert by_len[len(other.calls[0].prompt.encode())][:full] != by_len[first][:full]


def test_round_robin_envoy_config_is_valid(tmp_path: Path) -> None:
    replicas = [LocalReplica(f"r{i}", "h100", 21000 + i, 22000 + i) for i in range(3)]
    config = tmp_path / "rr.yaml"
    config.write_text(yaml.safe_dump(round_robin_bootstrap(23000, 23001, replicas)))
    done = subprocess.run([str(envoy_binary()), "--mode", "validate", "-c", str(config)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_generator_args_name_vllms_datasets(tmp_path: Path) -> None:
    sessions = generator_args("agent-sessions", trace=tmp_path / "t.jsonl", num_prompts=9, burst_prompts=5,
                              concurrency=4)
    assert sessions[sessions.index("--dataset-name") + 1] == "timed_trace" and "0.001" in sessions
    burst = generator_args("burst", trace=tmp_path / "t.jsonl", num_prompts=9, burst_prompts=5, concurrency=4)
    assert burst[burst.index("--num-prompts") + 1] == "5"
