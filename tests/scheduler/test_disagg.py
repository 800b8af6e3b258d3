"""Prefill/decode disaggregation through the real pipelines: the decode replica from the
normal pipeline over decode (and both) replicas, the prefill replica from each decider's rule."""

from __future__ import annotations

import pytest
from _sched_util import BS, engine_store_events, replica, request, tokens

from taskplane.errors import ConfigError
from taskplane.scheduler import Action, build_policy
from taskplane.scheduler.types import ReplicaView


def store_on(sched, name: str, toks: list[int]) -> None:  # type: ignore[no-untyped-def]
    sched.on_kv_events(name, engine_store_events(toks, salt=hash(name) & 0xFFFF)[0])


def pd_fleet(p: int = 2, d: int = 2, **kw: object) -> list[ReplicaView]:
    return ([replica(f"p{i}", role="prefill", **kw) for i in range(p)]
            + [replica(f"d{i}", role="decode", **kw) for i in range(d)])


@pytest.mark.parametrize("policy", ["llm-d-pd", "dynamo-disagg", "taskplane-pd", "taskplane"])
def test_long_new_prompt_is_disaggregated_onto_a_prefill_replica(policy: str) -> None:
    s = build_policy(policy, seed=1, metrics=False)
    d = s.decide(request(tokens(1, 160), session_id="a", step=0), pd_fleet(), 0.0)
    assert d.action is Action.PLACE
    assert d.replica in ("d0", "d1")
    assert d.prefill_replica in ("p0", "p1")


@pytest.mark.parametrize("policy", ["llm-d-pd", "dynamo-disagg", "taskplane-pd", "llm-d-scorers"])
def test_a_prefill_only_replica_never_serves_a_whole_call(policy: str) -> None:
    s = build_policy(policy, seed=1, metrics=False)
    for k in range(6):
        d = s.decide(request(tokens(k, 2), session_id=f"s{k}", step=0), pd_fleet(), float(k))
        assert d.replica in ("d0", "d1")
        # 32 new tokens: under every rule but llm-d's threshold 0, which always disaggregates
        assert (d.prefill_replica is not None) == (policy == "llm-d-pd")


def test_llm_d_threshold_counts_the_tokens_not_cached_on_the_decode_replica() -> None:
    s = build_policy({"policy": "llm-d-pd", "disaggregation": {"decider": {"type": "llm-d-pd",
                      "params": {"threshold": 512}}}}, metrics=False)
    convo = tokens(2, 64)  # 1024 tokens
    store_on(s, "d0", convo)
    store_on(s, "d1", convo)
    warm = s.decide(request(convo + tokens(2, 8, start=len(convo))), pd_fleet(), 0.0)  # 128 new on D
    assert warm.prefill_replica is None
    cold = s.decide(request(tokens(3, 64)), pd_fleet(), 1.0)  # 1024 new on D
    assert cold.prefill_replica is not None


def test_dynamo_stays_local_under_its_length_and_when_the_prefill_queue_is_long() -> None:
    s = build_policy("dynamo-disagg", metrics=False)
    short = s.decide(request(tokens(4, 50)), pd_fleet(), 0.0)  # 800 tokens <= 1000
    assert short.prefill_replica is None
    busy = [replica(f"p{i}", role="prefill", num_waiting=1) for i in range(2)] + pd_fleet(0, 2)
    long_busy = s.decide(request(tokens(5, 100)), busy, 1.0)  # 2 waiting >= max_prefill_queue_size
    assert long_busy.prefill_replica is None
    long_idle = s.decide(request(tokens(6, 100)), pd_fleet(), 2.0)
    assert long_idle.prefill_replica is not None


def test_taskplane_keeps_a_warm_session_on_its_decode_replica_and_prefills_where_the_prefix_is() -> None:
    s = build_policy("taskplane-pd", seed=0, metrics=False)
    convo = tokens(7, 100)  # 1600 tokens of session history
    store_on(s, "d1", convo)
    store_on(s, "p1", tokens(8, 100))  # another agent's system prompt sits on p1
    nxt = convo + tokens(7, 20, start=len(convo))  # a tool result of 320 new tokens
    warm = s.decide(request(nxt, session_id="w", step=3, steps_remaining=3), pd_fleet(), 0.0)
    assert warm.replica == "d1" and warm.prefill_replica is None
    fresh = s.decide(request(tokens(8, 100) + tokens(9, 20), session_id="n", step=0), pd_fleet(), 1.0)
    assert fresh.prefill_replica == "p1"  # its 1600-token prefix is already there


def test_taskplane_moves_a_medium_prefill_off_a_decode_heavy_replica_only() -> None:
    s = build_policy("taskplane-pd", seed=0, metrics=False)
    medium = tokens(10, 40)  # 640 new tokens: under long_prompt_tokens
    light = pd_fleet(2, 2, num_running=1)
    assert s.decide(request(medium, session_id="m1", step=0), light, 0.0).prefill_replica is None
    heavy = pd_fleet(2, 0) + [replica(f"d{i}", role="decode", num_running=12) for i in range(2)]
    assert s.decide(request(tokens(11, 40), session_id="m2", step=0), heavy, 1.0).prefill_replica is not None


def test_an_aggregated_fleet_never_disaggregates_and_a_bad_param_is_refused() -> None:
    s = build_policy("taskplane-pd", metrics=False)
    both = [replica(f"r{i}") for i in range(3)]
    d = s.decide(request(tokens(12, 200), session_id="x", step=0), both, 0.0)
    assert d.action is Action.PLACE and d.prefill_replica is None
    with pytest.raises(ConfigError, match="threshold"):
        build_policy({"policy": "llm-d-pd", "disaggregation": {"decider": {"type": "llm-d-pd",
                      "params": {"threshold": -1}}}}, metrics=False)
    assert BS == 16


def test_a_lent_replica_takes_whole_calls_and_prefills_for_decode_replicas_never_for_itself() -> None:
    # one "both" replica (a prefill replica the role planner lent to whole calls) and two decode ones
    fleet = [replica("b0", role="both"), replica("d0", role="decode"), replica("d1", role="decode")]
    s = build_policy("llm-d-pd", seed=1, metrics=False)
    placed = {s.decide(request(tokens(10 + k, 100), session_id=f"s{k}", step=0), fleet, float(k)).replica
              for k in range(12)}
    assert "b0" in placed  # it serves whole calls
    for k in range(12):
        d = s.decide(request(tokens(40 + k, 100), session_id=f"t{k}", step=0), fleet, 20.0 + k)
        if d.replica == "b0":
            assert d.prefill_replica is None  # never disaggregated onto itself
        else:
            assert d.prefill_replica == "b0"  # threshold 0: decode replicas prefill on the lent one
    # without decode-role replicas a "both" replica is no prefill target: an aggregated fleet
    agg = [replica("b0", role="both"), replica("b1", role="both")]
    assert all(s.decide(request(tokens(80 + k, 100)), agg, 40.0 + k).prefill_replica is None for k in range(4))
