"""Scheduler and gateway changes the real-engine bench led to, tested on their own.

- Working-set admission never refuses the first call of a task whose deadline budget is
  too short to wait out the refusal (on real vLLM, tasks due in 15-45 s refused with a
  30 s Retry-After all missed their deadlines); tasks with a long or no budget still wait.
- The gateway's /metrics parse reads only the lines it needs, to the same values as a
  full parse (a vLLM page is ~55 KB; the full parse blocked the event loop ~40 ms per
  replica per second). tests/bench_real/test_real_bench_vllm.py checks it on real pages.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from taskplane.engines.metrics import parse_metrics, relevant_lines
from taskplane.scheduler.policies import build_policy
from taskplane.scheduler.types import Action, CallOutcome, CallRequest, ReplicaView

BS = 16


def _fleet() -> list[ReplicaView]:
    return [ReplicaView(name=f"r{i}", model="m", gpu="h100", cost_per_hour_usd=2.5, kv_blocks_total=100,
                        kv_blocks_free=100, block_size=BS, has_kv_events=False) for i in range(2)]


def _call(task: str, budget_ms: float | None) -> CallRequest:
    return CallRequest(model="m", prompt_tokens=900, max_tokens=100, tenant="t", priority="standard",
                       session_id=task, task_id=task, step=0, steps_remaining=2, call_id=f"{task}:0",
                       block_size=BS, agent="a", budget_ms=budget_ms)


def test_a_task_that_cannot_wait_out_a_refusal_is_admitted() -> None:
    sched = build_policy("taskplane", seed=1, metrics=False)
    assert sched.admission is not None
    floor_ms = sched.admission.working_set_min_budget_retries * sched.admission.working_set_retry_after_s * 1000
    fleet = _fleet()
    for t in ("A", "B"):  # one 1,000-token context pinned per replica: 62.5 % of 1,600 tokens
        d = sched.decide(_call(t, None), fleet, 0.0)
        assert d.action == Action.PLACE
        sched.observe_completion(_call(t, None), CallOutcome(replica=d.replica or "", completion_tokens=100), 1.0)
    # no room for another standard task (75 %): one without a budget, or with a long one, is
    # held for room (working_set_hold_s) rather than refused at once
    assert sched.decide(_call("C", None), fleet, 1.5).action == Action.QUEUE
    assert sched.decide(_call("D", floor_ms + 1), fleet, 1.5).action == Action.QUEUE
    # one due sooner than the floor would lose its deadline waiting: it goes ahead
    short = sched.decide(_call("E", 20_000), fleet, 1.5)
    assert short.action == Action.PLACE and short.replica in {"r0", "r1"}


VLLM_LIKE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 5000.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 2560.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.8
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 10.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 12.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="64"} 1.0
"""


def full_parse(text: str) -> dict[str, float]:
    """The samples a full Prometheus parse yields (the reference)."""
    return {f"{s.name}{sorted(s.labels.items())}": s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_fast_path_reads_the_same_values() -> None:
    kept = relevant_lines(VLLM_LIKE)
    assert "iteration_tokens" not in kept and "_bucket" not in kept and "_created" not in kept
    fast, full = full_parse(kept), full_parse(VLLM_LIKE)
    assert fast and all(full[k] == v for k, v in fast.items())
    m = parse_metrics(VLLM_LIKE)
    assert (m.num_running, m.num_waiting, m.kv_cache_usage) == (3.0, 1.0, 0.25)
    assert (m.prefix_cache_queries, m.prefix_cache_hits, m.ttft_sum_s, m.ttft_count) == (5000.0, 2560.0, 0.8, 4.0)
    assert (m.block_size, m.num_gpu_blocks) == (128, 64)


def test_metrics_junk_still_raises() -> None:
    import pytest

    with pytest.raises(ValueError):
        parse_metrics("this is { not prometheus\n")
    assert parse_metrics("other_metric 1\n").num_running == 0


def test_working_set_scorer_spreads_new_tasks_by_pinned_context() -> None:
    """The opt-in "working-set" scorer: a new task goes where the pinned sessions' contexts
    leave the most KV room; a task's later calls are not pulled away from their pin."""
    from taskplane.scheduler.policies import build_scheduler

    sched = build_scheduler(policy="taskplane", admission=False, metrics=False, seed=3,
                            scorers=[{"type": "working-set", "weight": 1.0},
                                     {"type": "session-affinity", "weight": 2.0}])
    fleet = _fleet()
    first = sched.decide(_call("A", None), fleet, 0.0)
    assert first.action == Action.PLACE
    second = sched.decide(_call("B", None), fleet, 0.1)
    assert second.replica != first.replica  # A's 1,000 tokens are pinned on the first
    later = CallRequest(model="m", prompt_tokens=1200, max_tokens=100, tenant="t", priority="standard",
                        session_id="A", task_id="A", step=1, steps_remaining=1, call_id="A:1",
                        block_size=BS, agent="a")
    assert sched.decide(later, fleet, 1.0).replica == first.replica
