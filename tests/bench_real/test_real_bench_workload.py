"""The agents-vllm workload and the bench's plumbing, without starting any engine:
same seed, same requests; each call extends the previous one's prompt; the headers are
the ones the gateway parses; router command lines; the targets; refusals before start."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from taskplane.bench.ceiling import prompt_hit_ceiling
from taskplane.bench.metrics import task_figures
from taskplane.bench.options import BenchOptions
from taskplane.bench.real import run_bench, run_real_bench
from taskplane.bench.real_client import CallResult, TaskRun, routing_headers, task_outcome
from taskplane.bench.real_routers import ROUTERS, gateway_config, parse_routers, router_command
from taskplane.bench.real_workload import RealWorkload, real_agent_workload, text_of
from taskplane.bench.render import real_results_markdown
from taskplane.bench.targets import evaluate
from taskplane.config import parse_gateway_config
from taskplane.context import Priority, parse_headers
from taskplane.engines.vllm_launcher import VllmReplica
from taskplane.errors import UserError
from taskplane.store.records import TaskStatus


def _requests(seed: int) -> list[tuple[str, int, tuple[tuple[str, str], ...], int, float]]:
    w = real_agent_workload(12, seed)
    return [(t.task_id, c.step, tuple((m["role"], m["content"]) for m in c.messages), c.max_tokens, t.arrival_s)
            for t, c in w.calls()]


def test_same_seed_same_requests_other_seed_other_requests() -> None:
    assert _requests(3) == _requests(3)
    assert _requests(3) != _requests(4)


def test_each_call_extends_the_previous_prompt_and_fits_the_context() -> None:
    w = real_agent_workload(30, 1, max_context_tokens=4000)
    assert w.num_calls > 60
    systems: dict[str, str] = {}
    for task in w.tasks:
        assert systems.setdefault(task.agent, task.calls[0].messages[0]["content"]) == task.calls[0].messages[0]["content"]
        prompts = [c.prompt for c in task.calls]
        for before, after in itertools.pairwise(prompts):
            assert after.startswith(before) and len(after) > len(before)
        for c in task.calls:
            assert len(c.prompt.encode()) + c.max_tokens <= 4000
        assert [c.step for c in task.calls] == list(range(len(task.calls)))
        assert task.calls[0].gap_s == 0 and all(c.gap_s > 0 for c in task.calls[1:])
    # three agent types, three priorities, deadlines on every task
    assert len(systems) == 3
    assert {t.priority for t in w.tasks} == {"interactive", "standard", "batch"}
    assert all(t.deadline_s for t in w.tasks)


def test_texts_are_unique_per_key_and_exact_length() -> None:
    a, b = text_of("x", 1000), text_of("y", 1000)
    assert len(a.encode()) == 1000 and a != b and text_of("x", 1000) == a


def hit_ceiling(w: RealWorkload) -> float:
    return prompt_hit_ceiling(w.prompts(), 128)


def test_hit_ceiling_counts_whole_blocks_of_shared_prefixes() -> None:
    w = real_agent_workload(20, 2)
    c = hit_ceiling(w)
    assert 0.5 < c < 1.0
    # one task alone: its later calls reuse its earlier prompts, so the ceiling is positive
    one = real_agent_workload(1, 2)
    one.tasks = one.tasks[:1]
    assert hit_ceiling(one) > 0
    # by hand: 300 bytes (2 full blocks, nothing cached yet), then the same 300 and 100 more
    # (3 full blocks: the first two hit, the third is new); the prompt's last token never hits
    assert prompt_hit_ceiling([b"a" * 300, b"a" * 300 + b"b" * 100], 128) == 256 / 700
    assert prompt_hit_ceiling([b"a" * 256, b"a" * 256], 128) == 128 / 512
    assert prompt_hit_ceiling([b"a" * 300, b"c" + b"a" * 299], 128) == 0.0  # chained: no shared prefix


def test_taskplane_headers_parse_as_the_gateway_parses_them() -> None:
    w = real_agent_workload(20, 1)
    task = next(t for t in w.tasks if t.priority == "interactive" and len(t.calls) > 2)
    call = task.calls[1]
    ctx = parse_headers({k.lower(): v for k, v in routing_headers("taskplane", task, call, 12.5).items()})
    assert ctx.task_id == ctx.session_id == task.task_id
    assert ctx.tenant == task.tenant and ctx.priority is Priority.INTERACTIVE
    assert ctx.step == 1 and ctx.steps_remaining == len(task.calls) - 2
    assert ctx.budget_ms == 12500
    assert ctx.tool == call.tool and call.tool  # the call after a tool names it
    first = parse_headers({k.lower(): v for k, v in routing_headers("taskplane", task, task.calls[0], None).items()})
    assert first.tool is None
    assert routing_headers("session", task, call, 12.5) == {"X-Session-ID": task.task_id}


def _replicas(n: int = 2) -> list[VllmReplica]:
    return [VllmReplica(index=i, url=f"http://127.0.0.1:{9000 + i}", metrics_url=f"http://127.0.0.1:{9000 + i}/metrics",
                        kv_events=f"tcp://127.0.0.1:{9100 + i}", replay=f"tcp://127.0.0.1:{9200 + i}",
                        topic="kv-events", pid=0, port=9000 + i, model="tiny-llama", log_path="/dev/null")
            for i in range(n)]


def test_gateway_config_is_valid_for_the_gateway(tmp_path: Path) -> None:
    cfg = parse_gateway_config(gateway_config(_replicas(), num_blocks=48, max_context_tokens=6016,
                                              outbox=tmp_path / "outbox"))
    assert [r.kv_events for r in cfg.pools[0].replicas] == ["tcp://127.0.0.1:9100", "tcp://127.0.0.1:9101"]
    assert {t.id: t.max_priority.value for t in cfg.tenants} == {
        "acme": "interactive", "globex": "standard", "initech": "batch"}
    assert cfg.scheduler.policy == "taskplane" and cfg.auth is False


def test_peer_command_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "peers"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / ".taskplane-peers-stamp").write_text("x")
    monkeypatch.setenv("TASKPLANE_PEERS_VENV", str(venv))
    reps = _replicas()
    kw = {"port": 1, "metrics_port": 2, "work": tmp_path, "num_blocks": 48, "max_context_tokens": 6016}
    sglang = router_command(ROUTERS["sglang-cache-aware"], reps, **kw)  # type: ignore[arg-type]
    assert sglang[1:3] == ["-m", "sglang_router.launch_router"]
    assert "--disable-circuit-breaker" in sglang and sglang[sglang.index("--policy") + 1] == "cache_aware"
    kv = router_command(ROUTERS["vllm-router-kv-aware"], reps, **kw)  # type: ignore[arg-type]
    assert kv.count("--kv-event-source") == 2 and kv.count("--kv-event-replay-source") == 2
    assert f"{reps[1].url}={reps[1].kv_events}" in kv and "--kv-aware-session-affinity-ttl-secs" in kv
    assert kv[kv.index("--kv-event-block-size") + 1] == "128"
    ch = router_command(ROUTERS["vllm-router-consistent-hash"], reps, **kw)  # type: ignore[arg-type]
    assert ch[ch.index("--policy") + 1] == "consistent_hash" and ch[ch.index("--worker-urls") + 1] == reps[0].url
    tp = router_command(ROUTERS["taskplane"], reps, **kw)  # type: ignore[arg-type]
    assert tp[1:4] == ["-m", "taskplane.cli", "gateway"] and (tmp_path / "gateway.yaml").is_file()


def test_router_names() -> None:
    assert [r.name for r in parse_routers(None)] == list(ROUTERS)
    assert [r.name for r in parse_routers("round-robin,taskplane")] == ["round-robin", "taskplane"]
    with pytest.raises(UserError, match="unknown router nope"):
        parse_routers("taskplane,nope")


def test_targets_against_the_best_peer() -> None:
    policies = {
        "taskplane": {"prefix_hit_ratio": 0.6, "ttft_p50_ms": 70.0},
        "a": {"prefix_hit_ratio": 0.55, "ttft_p50_ms": 100.0},
        "b": {"prefix_hit_ratio": 0.65, "ttft_p50_ms": 80.0},
    }
    hits, ttft = evaluate("agents-vllm", policies)
    assert hits["best_baseline"] == "b" and hits["met"] is False and hits["ratio"] == pytest.approx(0.923, abs=1e-3)
    assert ttft["best_baseline"] == "b" and ttft["met"] is False and ttft["ratio"] == 0.875
    policies["taskplane"] = {"prefix_hit_ratio": 0.7, "ttft_p50_ms": 60.0}
    assert all(t["met"] for t in evaluate("agents-vllm", policies))
    page = real_results_markdown({
        "workload": "agents-vllm", "replicas": 2, "seed": 1, "time_scale": 1.0, "hit_ceiling": 0.7,
        "policies": {n: {"rule": n, **m} for n, m in policies.items()}, "targets": evaluate("agents-vllm", policies),
        "workload_info": {"tasks": 3, "calls": 9, "agents": "coder", "tenants": "acme"},
        "engine_info": {"num_blocks": 64, "block_size": 128}, "machine": {"cpu_model": "cpu", "nproc": 2}})
    assert "| router | prefix hits |" in page and "| taskplane | 70.0% |" in page
    assert "| TTFT p50 <= 0.8x the best peer's | 60 | b (80) | 0.75 | yes |" in page


def _call(ok: bool, error: str | None = None) -> CallResult:
    return CallResult(task_id="t", step=0, tenant="acme", priority="interactive", sent_s=0.0, ok=ok, error=error,
                      attempts=2)


def test_a_task_counts_as_succeeded_by_the_rule_of_the_simulated_bench() -> None:
    w = real_agent_workload(4, 1)
    task = w.tasks[0]
    assert task.deadline_s is not None
    in_time = task_outcome(task, [_call(True)], None, task.arrival_s + task.deadline_s)
    late = task_outcome(task, [_call(True)], None, task.arrival_s + task.deadline_s + 0.1)
    failed = task_outcome(task, [_call(False, "HTTP 500: x")], "HTTP 500: x", task.arrival_s + 1)
    gave_up = task_outcome(task, [], "deadline passed", task.arrival_s + task.deadline_s + 1)
    assert in_time.status is late.status is TaskStatus.SUCCEEDED and in_time.deadline_met and not late.deadline_met
    assert failed.status is TaskStatus.FAILED and gave_up.status is TaskStatus.FAILED_DEADLINE
    assert in_time.attempts == 2 and in_time.calls_done == 1 and in_time.calls_total == len(task.calls)
    figures = task_figures([in_time, late, failed, gave_up])
    assert figures["tasks"] == 4 and figures["tasks_succeeded"] == 1 and figures["deadline_met_ratio"] == 0.25
    assert figures["task_e2e_p50_s"] == pytest.approx(task.deadline_s)
    line = TaskRun(task=task, result=late, started_s=task.arrival_s, calls=[_call(True)]).as_json()
    assert line["completed"] and not line["abandoned"] and line["deadline_met"] is False
    assert line["deadline_s"] == task.deadline_s and line["calls"][0]["attempts"] == 2


def test_refusals_come_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--replicas 2"):
        run_real_bench(BenchOptions(out=tmp_path, engine="vllm", replicas=16))
    with pytest.raises(UserError, match="agents workload"):
        run_bench(BenchOptions(out=tmp_path, engine="vllm", replicas=2, workload="mooncake"))
    with pytest.raises(UserError, match="--engine sim"):
        run_bench(BenchOptions(out=tmp_path, engine="vllm", replicas=2, load="1.0"))
    with pytest.raises(UserError, match="unknown router"):
        run_real_bench(BenchOptions(out=tmp_path, engine="vllm", replicas=2, policies="bogus"))
    assert not any(tmp_path.iterdir())


def test_the_gateway_histograms_are_read_over_every_label_set() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client import Histogram as PromHistogram

    from taskplane.bench.real_metrics import DECISION, TTFT, gateway_figures, histograms

    reg = CollectorRegistry()
    ttft = PromHistogram(TTFT, "ttft", ["model"], registry=reg, buckets=(0.1, 1.0))
    decision = PromHistogram(DECISION, "decision", ["policy"], registry=reg, buckets=(50e-6, 100e-6, 1e-3))

    def page() -> str:
        return generate_latest(reg).decode()

    before = histograms(page(), (TTFT, DECISION))
    assert before[TTFT].count == 0 and before[DECISION].buckets == {}  # no label set observed yet
    ttft.labels("a").observe(0.2)
    ttft.labels("b").observe(0.4)
    for _ in range(99):
        decision.labels("taskplane").observe(40e-6)
    decision.labels("other").observe(500e-6)
    after = histograms(page(), (TTFT, DECISION))
    assert after[TTFT].count == 2 and after[TTFT].sum == pytest.approx(0.6)
    assert after[DECISION].buckets[50e-6] == 99 and after[DECISION].buckets[float("inf")] == 100
    figures = gateway_figures(before, after)
    assert figures["gateway_ttft_mean_ms"] == 300.0
    assert figures["decision_mean_us"] == pytest.approx((99 * 40 + 500) / 100, abs=0.1)
    assert figures["decision_p99_us"] == 50.0  # 99 of 100 within the 50 µs bucket
    assert histograms("", [TTFT])[TTFT].count == 0
