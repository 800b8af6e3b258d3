"""Several base models per simulated replica (SwapSim): a call of an asleep model swaps it in
with sleep.py's timings, the awake model's calls finish first, the KV cache is lost, and a
fleet under shifting demand serves both models' tasks and records their costs."""

from __future__ import annotations

from taskplane.bench.models import ModelsWorkload, models_fleet, models_tasks
from taskplane.scheduler.kv.events import AllBlocksCleared
from taskplane.scheduler.policies import build_policy
from taskplane.sim.cluster import ClusterSpec, ReplicaSpec
from taskplane.sim.sleep import sleep_seconds, wake_seconds
from taskplane.sim.swap_cluster import SwapSim, simulate_models
from taskplane.sim.workloads.base import CallSpec, TaskSpec, Workload
from taskplane.store.records import Outcome, TaskStatus

A, B = "llama-3.1-8b", "qwen-2.5-7b"
SWAP_S = sleep_seconds("h100", A, 1) + wake_seconds("h100", B, 1)


def _task(name: str, model: str, at: float, calls: int = 2, out: int = 50) -> TaskSpec:
    return TaskSpec(task_id=name, arrival_s=at, model=model, prefix_key=1 if model == A else 2, prefix_tokens=1024,
                    calls=[CallSpec(output_tokens=out, append_tokens=256) for _ in range(calls)])


def _one_replica() -> ClusterSpec:
    return ClusterSpec([ReplicaSpec("r0", model=A, models=(A, B))])


def test_a_call_of_an_asleep_model_swaps_it_in_with_the_swap_in_its_ttft() -> None:
    res = simulate_models(_one_replica(), Workload("w", [_task("b", B, 0.0)], block_size=16),
                          build_policy("taskplane", metrics=False))
    calls = sorted(res.calls, key=lambda c: c.step)
    assert [c.outcome for c in calls] == [Outcome.SUCCESS, Outcome.SUCCESS]
    assert calls[0].ttft_s is not None and calls[0].ttft_s >= SWAP_S
    assert calls[1].ttft_s is not None and calls[1].ttft_s < 0.5  # awake now: no second swap
    assert res.replicas[0].model_swaps == 1 and abs(res.replicas[0].swap_s - SWAP_S) < 0.05


def test_the_swap_waits_for_the_awake_models_call_then_the_kv_is_gone() -> None:
    class Recorder:
        """taskplane, recording the KV events it is fed."""

        def __init__(self) -> None:
            self.inner = build_policy("taskplane", metrics=False)
            self.cleared = 0

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        def on_kv_events(self, replica: str, events: list[object], seq: int | None = None) -> None:
            self.cleared += sum(isinstance(e, AllBlocksCleared) for e in events)
            self.inner.on_kv_events(replica, events, seq)

    policy = Recorder()
    # a long A call in flight when B's call arrives; then A again with the same prompt prefix
    wl = Workload("w", [_task("a", A, 0.0, calls=1, out=1500), _task("b", B, 0.5, calls=1),
                        _task("a2", A, 60.0, calls=1)], block_size=16)
    res = simulate_models(_one_replica(), wl, policy)
    by = {c.task_id: c for c in res.calls}
    assert all(c.outcome == Outcome.SUCCESS for c in res.calls)  # A's call was not aborted (mode=wait)
    assert by["b"].first_token_s is not None and by["b"].first_token_s >= by["a"].finished_s + SWAP_S
    assert by["a2"].cached_tokens == 0  # the swap discarded A's prefix
    assert res.replicas[0].model_swaps == 2 and policy.cleared >= 2


def test_shifting_demand_both_models_complete_with_costs_and_swaps() -> None:
    # every task of the first half of the window is A's, of the second B's
    shape = ModelsWorkload(tasks=80, tasks_per_s_per_replica=0.6, heavy_share=1.0)
    cluster = ClusterSpec.fleet("h100:3")  # A awake on one, B on two: B can spare one while A is busy
    wl = models_tasks(shape, 3, seed=3)
    sim = SwapSim(models_fleet(cluster, shape, swap=True), wl, build_policy("taskplane", seed=3, metrics=False),
                  seed=3)
    res = sim.run()
    done = {t.task_id for t in res.tasks if t.status == TaskStatus.SUCCEEDED}
    models = {t.model for t in wl.tasks if t.task_id in done}
    assert models == {A, B} and len(done) >= 0.8 * len(wl.tasks)
    ok = [c for c in res.calls if c.outcome == Outcome.SUCCESS]
    assert ok and all(c.cost_usd > 0 and c.model_served == c.model_requested for c in ok)
    assert all(t.cost_usd > 0 for t in res.tasks if t.task_id in done)
    assert sum(r.model_swaps for r in res.replicas) >= 1


def test_a_single_model_fleet_runs_as_the_plain_simulator() -> None:
    from taskplane.sim.cluster import simulate

    wl = Workload("w", [_task("a", A, 0.0), _task("b", A, 1.0)], block_size=16)
    plain = simulate(ClusterSpec.fleet("h100:2"), wl, build_policy("taskplane", metrics=False))
    swap = simulate_models(ClusterSpec.fleet("h100:2"), wl, build_policy("taskplane", metrics=False))
    assert [c.model_dump() for c in plain.attempt_records()] == [c.model_dump() for c in swap.attempt_records()]
