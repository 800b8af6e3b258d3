"""``taskplane bench --workload models``: the shifting demand and the runs it compares."""

from __future__ import annotations

import pytest

from taskplane.bench.models import ModelsWorkload, models_fleet, models_tasks, parse_runs
from taskplane.errors import UserError
from taskplane.sim.cluster import ClusterSpec


def test_demand_shifts_from_the_first_model_to_the_second_and_prompts_are_their_own() -> None:
    shape = ModelsWorkload(tasks=400)
    wl = models_tasks(shape, 4, seed=1)
    a, b = shape.models
    mid = sorted(t.arrival_s for t in wl.tasks)[len(wl.tasks) // 2]
    first = [t.model for t in wl.tasks if t.arrival_s < mid]
    second = [t.model for t in wl.tasks if t.arrival_s >= mid]
    assert first.count(a) / len(first) > 0.8 and second.count(b) / len(second) > 0.8
    assert not ({t.prefix_key for t in wl.tasks if t.model == a} & {t.prefix_key for t in wl.tasks if t.model == b})


def test_fleets_split_the_same_gpus_and_runs_parse() -> None:
    shape = ModelsWorkload()
    static = models_fleet(ClusterSpec.fleet("h100:4"), shape, swap=False)
    swap = models_fleet(ClusterSpec.fleet("h100:4"), shape, swap=True)
    assert [r.model for r in static.replicas] == [r.model for r in swap.replicas] == [shape.models[0]] * 2 + [
        shape.models[1]] * 2
    assert all(r.hosted() == (r.model,) for r in static.replicas)
    assert all(set(r.hosted()) == set(shape.models) for r in swap.replicas)
    assert parse_runs("taskplane,round-robin:static") == [
        ("taskplane", "swap"), ("taskplane", "static"), ("round-robin", "static")]
    with pytest.raises(UserError):
        parse_runs("taskplane:both")
