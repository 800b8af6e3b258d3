"""The ``prefill-finish`` filter: a long uncached prefill (or a call whose warm replica has a
long prefill queue) goes where its prefill would end first, not where its prefix is warm;
a short call keeps affinity."""

from __future__ import annotations

from typing import Any

from _sched_util import BS, engine_store_events, removed, replica, request, tokens

from taskplane.scheduler import Action, CallOutcome, build_policy
from taskplane.scheduler.filters.prefill import prefill_end_ms
from taskplane.scheduler.flowcontrol.controller import FlowControl
from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.scheduler.policies import PRESETS, build_scheduler
from taskplane.scheduler.table import as_table
from taskplane.scheduler.types import ReplicaView

BIG = 20_000  # KV blocks: room for a 60,000-token prompt
# these tests ask where a call goes, not when: the prefill gate (which would hold a call for a
# replica with prompt tokens in flight, tests/scheduler/test_prefill_gate.py) is off
PLACE_NOW = AdmissionSettings(serial_prefill=False)


def taskplane() -> FlowControl:
    return build_policy("taskplane", metrics=False, admission=PLACE_NOW)


def node(name: str, **kw: Any) -> ReplicaView:
    return replica(name, kv_blocks_total=BIG, kv_blocks_free=BIG, **kw)


def variant(**params: Any) -> FlowControl:
    """The taskplane preset with the filter's parameters changed (None: without the filter)."""
    filters: list[Any] = []
    for f in PRESETS["taskplane"].filters:
        if f != "prefill-finish":
            filters.append(f)
        elif params.get("off") is None:
            filters.append({"type": "prefill-finish", "params": params})
    return build_scheduler(policy="taskplane", filters=filters, metrics=False, admission=PLACE_NOW)


def warm(s: FlowControl, name: str, toks: list[int]) -> None:
    s.on_kv_events(name, engine_store_events(toks, salt=hash(name) & 0xFFFF)[0])


def placed_by(variants: dict[str, FlowControl], prompt: list[int], warm_tokens: int, pool: list[ReplicaView], call_id: str) -> dict[str, str]:
    """Where each variant places ``prompt`` with its first ``warm_tokens`` cached on "warm"."""
    decided = {}
    for label, s in variants.items():
        warm(s, "warm", prompt[:warm_tokens])
        d = s.decide(request(prompt, call_id=call_id), pool, 0.0)
        assert d.action is Action.PLACE
        decided[label] = d.replica
    return decided


def test_a_long_cold_prompt_goes_where_its_prefill_ends_first_against_a_warm_prefix() -> None:
    prompt = tokens(1, 60_000 // BS)  # 60,000 tokens: ~5 s of prefill on an idle H100 (prior)
    # "warm" holds 24,000 of them but has 36,000 tokens (~3 s) of prefill queued: ends at ~6 s;
    # "idle" holds nothing and has nothing queued: ends at ~5 s
    pool = [node("warm", inflight_prefill_tokens=36_000), node("idle")]
    decided = placed_by({"on": taskplane(), "off": variant(off=True)}, prompt, 24_000, pool, "long")
    assert decided == {"on": "idle", "off": "warm"}  # without the rule affinity wins


def test_the_predicted_prefill_end_is_the_queue_plus_the_uncached_suffix() -> None:
    s = taskplane()
    prompt = tokens(1, 60_000 // BS)
    warm(s, "warm", prompt[:24_000])
    table = as_table([node("warm", inflight_prefill_tokens=36_000), node("idle")])
    end = prefill_end_ms(s.pipeline.state(request(prompt), table, s.pipeline.pool(table, "m", ()), 0.0, "m"))
    assert abs(end[0] - (36_000 + 36_000) / 12_000 * 1000) < 1.0  # the H100 prior: 12,000 tokens/s
    assert abs(end[1] - 60_000 / 12_000 * 1000) < 1.0


def test_a_short_call_keeps_affinity_when_the_wait_there_is_short() -> None:
    s = taskplane()
    prompt = tokens(2, 4_000 // BS)
    warm(s, "warm", prompt[:3_200])
    # 6,000 queued tokens: ~0.5 s of wait on the warm replica, below max_wait_ms (1,000)
    d = s.decide(request(prompt, call_id="short"), [node("warm", inflight_prefill_tokens=6_000), node("idle")], 0.0)
    assert d.action is Action.PLACE and d.replica == "warm"
    assert d.cached_blocks == 3_200 // BS


def test_a_short_call_leaves_a_warm_replica_behind_a_long_prefill() -> None:
    prompt = tokens(2, 4_000 // BS)
    pool = [node("warm", inflight_prefill_tokens=36_000), node("idle")]  # ~3 s queued on the warm one
    decided = placed_by({"on": taskplane(), "long only": variant(max_wait_ms=None)},
                        prompt, 3_200, pool, "short")
    assert decided == {"on": "idle", "long only": "warm"}


def test_a_pinned_session_leaves_its_replica_when_the_prefill_queued_there_is_long() -> None:
    convo = tokens(3, 4_000 // BS)
    for label, s, home_after in (
        ("on", taskplane(), "idle"),
        ("long only", variant(max_wait_ms=None), "home"),
    ):
        first = s.decide(request(convo, session_id="s", step=0, call_id="s0"), [node("home")], 0.0)
        assert first.replica == "home"
        warm(s, "home", convo)
        s.observe_completion(request(convo, session_id="s", step=0), CallOutcome(replica="home"), now_s=1.0)
        nxt = convo + tokens(3, 10, start=len(convo))
        pool = [node("home", inflight_prefill_tokens=36_000), node("idle")]
        d = s.decide(request(nxt, session_id="s", step=1, call_id="s1"), pool, 2.0)
        assert d.action is Action.PLACE, label
        assert d.replica == home_after, label
        assert d.session_moved == (home_after != "home"), label


def test_a_saturated_replica_does_not_set_the_earliest_end() -> None:
    """The earliest end counts only replicas that can take the call now: an idle replica
    with a full engine queue would only hold the call."""
    s = taskplane()
    prompt = tokens(4, 60_000 // BS)
    pool = [node("busy", inflight_prefill_tokens=12_000), node("later", inflight_prefill_tokens=24_000),
            node("full", num_waiting=2)]
    d = s.decide(request(prompt, call_id="long"), pool, 0.0)
    assert d.action is Action.PLACE and d.replica == "busy"


def test_a_host_tier_prefix_counts_as_loaded_not_recomputed() -> None:
    """80,000 tokens, 40,000 of them in one replica's host tier (nothing on its GPU) behind
    ~0.8 s of queued prefill: loading them (~0.13 s at 3.3 us a token) and prefilling the rest
    ends at ~4.3 s there, against ~6.7 s on the idle replica. Counted as recompute (a
    GPU-only view) the host replica would end at ~7.5 s."""
    prompt = tokens(5, 80_000 // BS)
    pool = [node("host", inflight_prefill_tokens=10_000), node("idle")]
    s = taskplane()
    # as vLLM offloads: computed on the GPU, written to host memory, evicted from the GPU
    events, engine_hashes = engine_store_events(prompt[:40_000], salt=hash("host") & 0xFFFF)
    s.on_kv_events("host", [*events, *({**e, "medium": "CPU"} for e in events), removed(engine_hashes)])
    table = as_table(pool)
    state = s.pipeline.state(request(prompt), table, s.pipeline.pool(table, "m", ()), 0.0, "m")
    assert state.matched()[0] == 0 and state.tier_matched()[0] == 40_000 // BS
    end = prefill_end_ms(state)
    assert abs(end[0] - (10_000 / 12 + 40_000 / 12 + 40_000 * 3.3e-3)) < 1.0
    assert end[0] < end[1] < 10_000 / 12 + 80_000 / 12  # ... and the GPU-only view would reverse it
    d = s.decide(request(prompt, call_id="long"), pool, 0.0)
    assert d.action is Action.PLACE and d.replica == "host"
