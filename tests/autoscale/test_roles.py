"""The role planner's decisions on constructed observations."""

from __future__ import annotations

import pytest

from taskplane.autoscale.roles import ReplicaLoad, RolePlanner, RolePlannerConfig, RoleSignals

CFG = RolePlannerConfig(interval_s=10.0, prefill_tokens_per_s=10_000.0, sustain=2, cooldown_s=30.0)


def fleet(n_p: int, n_d: int, *, prefill_tokens: float = 0.0, decode_seqs: int = 0,
          kv: float = 0.0) -> list[ReplicaLoad]:
    """``n_p`` prefill replicas each with ``prefill_tokens`` queued, ``n_d`` decode ones each
    running ``decode_seqs`` requests at KV use ``kv``."""
    return ([ReplicaLoad(f"p-{i}", "prefill", prefill_tokens=prefill_tokens) for i in range(n_p)]
            + [ReplicaLoad(f"d-{i}", "decode", num_running=decode_seqs, kv_usage=kv) for i in range(n_d)])


def run(planner: RolePlanner, replicas: list[ReplicaLoad], times: list[float]) -> list[str | None]:
    out = []
    for t in times:
        m = planner.plan(RoleSignals(t, replicas))
        out.append(None if m is None else f"{m.replica}->{m.role}")
    return out


def test_prefill_backlog_moves_the_least_loaded_decode_replica_to_prefill() -> None:
    reps = fleet(1, 4, prefill_tokens=20_000.0, decode_seqs=4)  # 2 s of prefill queued; decode light
    reps[3] = ReplicaLoad("d-3", "decode", num_running=1)  # the one giving up the least
    moves = run(RolePlanner(CFG), reps, [10.0, 20.0])
    assert moves == [None, "d-3->prefill"]  # the first plan alone is not enough (sustain=2)


def test_decode_load_moves_a_prefill_replica_back() -> None:
    reps = fleet(2, 4, prefill_tokens=100.0, decode_seqs=40)  # decode load 40/24 > 1; prefill near idle
    reps[1] = ReplicaLoad("p-1", "prefill", prefill_tokens=0.0)
    assert run(RolePlanner(CFG), reps, [10.0, 20.0]) == [None, "p-1->decode"]


def test_kv_use_alone_counts_as_decode_load() -> None:
    reps = fleet(2, 4, decode_seqs=2, kv=0.95)  # few sequences, but their KV fills the replicas
    assert run(RolePlanner(CFG), reps, [10.0, 20.0])[-1] is not None


def test_never_below_one_replica_per_role() -> None:
    planner = RolePlanner(CFG)
    busy_decode = fleet(1, 5, decode_seqs=200, kv=1.0)  # decode overloaded, the one prefill idle
    assert run(planner, busy_decode, [10.0 * k for k in range(1, 20)]) == [None] * 19
    busy_prefill = fleet(5, 1, prefill_tokens=1e6)  # prefill swamped, one decode replica left
    assert run(RolePlanner(CFG), busy_prefill, [10.0 * k for k in range(1, 20)]) == [None] * 19


def test_no_move_inside_the_hysteresis_band() -> None:
    # 0.3 s of prefill queued per replica: above the low mark, below the high one; decode at 0.8
    reps = fleet(2, 4, prefill_tokens=3_000.0, decode_seqs=19)
    assert run(RolePlanner(CFG), reps, [10.0 * k for k in range(1, 20)]) == [None] * 19


def test_a_prefill_replica_leaving_must_not_push_the_rest_over_the_high_mark() -> None:
    # decode is overloaded, but 0.3 s per prefill replica would become 0.6 s on one: stay
    reps = fleet(2, 4, prefill_tokens=3_000.0, decode_seqs=40)
    assert run(RolePlanner(CFG), reps, [10.0 * k for k in range(1, 10)]) == [None] * 9


def test_alternating_signals_do_not_move_and_cooldown_spaces_moves() -> None:
    planner = RolePlanner(CFG)
    want_prefill = fleet(2, 6, prefill_tokens=20_000.0, decode_seqs=2)
    idle = fleet(2, 6, decode_seqs=12)  # prefill idle, decode at 0.5: wants decode
    assert run(planner, want_prefill, [10.0]) + run(planner, idle, [20.0]) + run(planner, want_prefill, [30.0]) \
        == [None, None, None]  # never sustained
    moves = run(planner, want_prefill, [40.0, 50.0, 60.0, 70.0])
    assert moves[0] is not None and moves[1:3] == [None, None]  # at 40 s (sustained since 30 s), then cooldown
    assert moves[3] is not None  # 30 s after the first


def test_config_rejects_an_inverted_band() -> None:
    with pytest.raises(ValueError):
        RolePlannerConfig(prefill_low_s=1.0, prefill_high_s=0.5)
    with pytest.raises(ValueError):
        RolePlannerConfig(min_prefill=0)


LEND = RolePlannerConfig(interval_s=10.0, prefill_tokens_per_s=10_000.0, sustain=1, cooldown_s=0.0,
                         lend_idle_prefill=True)


def test_the_last_idle_prefill_replica_is_lent_and_reclaimed_when_prefill_backs_up() -> None:
    planner = RolePlanner(LEND)
    idle = fleet(1, 4, decode_seqs=12)  # prefill idle, decode at 0.5
    assert run(planner, idle, [10.0]) == ["p-0->both"]
    lent = [ReplicaLoad("p-0", "both", num_running=3), *idle[1:]]
    assert run(planner, lent, [20.0, 30.0]) == [None, None]  # lent once; still one on the prefill side
    backed_up = [ReplicaLoad("p-0", "both", prefill_tokens=20_000.0), *idle[1:]]
    assert run(planner, backed_up, [40.0]) == ["p-0->prefill"]  # reclaimed before any decode replica moves
    assert run(RolePlanner(CFG), idle, [10.0, 20.0, 30.0]) == [None] * 3  # lending is off by default
