"""The Scheduler end to end on plain data: sessions, moves, admission, budgets, feedback."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from _sched_util import BS, engine_store_events, fleet, replica, request, tokens
from prometheus_client import REGISTRY as PROM

from taskplane.scheduler import Action, CallOutcome, build_policy
from taskplane.scheduler.policies import build_scheduler
from taskplane.scheduler.types import ReplicaView


def store_on(sched, name: str, toks: list[int]) -> None:  # type: ignore[no-untyped-def]
    sched.on_kv_events(name, engine_store_events(toks, salt=hash(name) & 0xFFFF)[0])


def test_session_stays_on_its_replica_across_steps() -> None:
    s = build_policy("taskplane", seed=3)
    pool = fleet(4)
    convo = tokens(1, 4)
    first = s.decide(request(convo, session_id="s", step=0), pool, 0.0)
    assert first.action is Action.PLACE
    home = first.replica
    assert home is not None
    for step in range(1, 6):
        store_on(s, home, convo)  # the engine cached the conversation so far
        s.observe_completion(request(convo, session_id="s"), CallOutcome(replica=home), now_s=step * 10.0 - 5)
        convo = convo + tokens(1, 2, start=len(convo))
        d = s.decide(request(convo, session_id="s", step=step), pool, step * 10.0)
        assert d.replica == home and not d.session_moved
        assert d.cached_blocks == len(convo) // BS - 2


def _warm_setup() -> tuple[object, list[ReplicaView], list[int]]:
    s = build_policy("taskplane", seed=0)
    convo = tokens(1, 12)
    store_on(s, "home", convo)
    store_on(s, "partial", convo[: 8 * BS])
    store_on(s, "other", tokens(2, 12))
    pool = [replica("home"), replica("partial"), replica("other"), replica("empty")]
    d = s.decide(request(convo, session_id="s"), pool, 0.0)  # type: ignore[attr-defined]
    assert d.replica == "home"
    return s, pool, convo


def test_session_moves_to_best_overlap_when_replica_fails() -> None:
    s, pool, convo = _warm_setup()
    broken_before = s.sessions.broken.get("failed", 0)  # type: ignore[attr-defined]
    sick = [replace(r, healthy=r.name != "home") for r in pool]
    d = s.decide(request(convo, session_id="s"), sick, 1.0)  # type: ignore[attr-defined]
    assert d.replica == "partial" and d.session_moved and d.cached_blocks == 8
    assert s.sessions.broken["failed"] == broken_before + 1  # type: ignore[attr-defined]
    # the pin follows the session to its new home
    assert s.sessions.get("s", 2.0) == "partial"  # type: ignore[attr-defined]


def test_session_moves_when_replica_saturates_or_leaves() -> None:
    s, pool, convo = _warm_setup()
    busy = [replace(r, num_waiting=4) if r.name == "home" else r for r in pool]
    d = s.decide(request(convo, session_id="s"), busy, 1.0)  # type: ignore[attr-defined]
    assert d.replica == "partial" and d.session_moved
    assert s.sessions.broken.get("saturated") == 1  # type: ignore[attr-defined]
    s2, pool2, convo2 = _warm_setup()
    s2.replica_removed("home")  # type: ignore[attr-defined]
    d = s2.decide(request(convo2, session_id="s"), [r for r in pool2 if r.name != "home"], 1.0)  # type: ignore[attr-defined]
    assert d.replica == "partial"


def test_replica_failed_breaks_all_its_pins() -> None:
    s = build_policy("taskplane")
    pool = fleet(2)
    for i in range(6):
        s.decide(request(tokens(i, 2), session_id=f"s{i}"), pool, 0.0)
    on_r0 = sum(1 for i in range(6) if s.sessions.get(f"s{i}", 0.0) == "r0")  # type: ignore[union-attr]
    assert s.replica_failed("r0") == on_r0


def test_pin_ttl_learned_from_tool_gaps() -> None:
    s = build_policy("taskplane")
    pins = s.sessions
    assert pins is not None
    pool = fleet(3)
    t = 0.0
    for step in range(6):  # the agent's tool calls take ~20 s
        d = s.decide(request(tokens(1, 2), session_id="s", agent="coder"), pool, t)
        s.observe_completion(request(tokens(1, 2), session_id="s"), CallOutcome(replica=d.replica or ""), t + 1)
        t += 1 + 20.0 + (step % 2)
    ttl = pins.ttl_for("coder")
    assert 20.0 <= ttl <= 25.0
    assert pins.ttl_for("unknown-agent") == pins.default_ttl_s
    assert pins.get("s", t - 21 + ttl - 0.5) is not None
    assert pins.get("s", t - 21 + ttl + 0.5) is None  # expired


def test_unmeetable_budget_and_fallback() -> None:
    s = build_policy("taskplane", pools=[type("P", (), {"model": "big", "fallback": "small"})()])
    pool = [replica("big0", model="big", gpu="cpu"), replica("small0", model="small", gpu="h100")]
    req = request(tokens(1, 64), model="big", budget_ms=2_000)
    d = s.decide(req, pool, 0.0)
    assert d.action is Action.UNMEETABLE and "even on an idle replica" in d.reason
    moved = s.decide(request(tokens(1, 64), model="big", budget_ms=2_000, allow_fallback=True), pool, 0.0)
    assert moved.action is Action.PLACE and moved.model == "small" and moved.replica == "small0"
    assert "fallback" in moved.reason
    # no budget at all cannot be unmeetable
    assert s.decide(request(tokens(1, 64), model="big"), pool, 0.0).action is Action.PLACE


def test_cheaper_gpu_when_it_meets_the_budget_and_the_first_choice_does_not() -> None:
    s = build_policy("taskplane")
    fast_idle = [
        replica("h100", gpu="h100", cost_per_hour_usd=2.5),
        replica("l40s", gpu="l40s", cost_per_hour_usd=0.9),
    ]
    req = dict(budget_ms=4_000, max_tokens=32)
    assert s.decide(request(tokens(1, 8), **req), fast_idle, 0.0).replica == "h100"  # faster wins
    # the H100 is backed up (its queue alone is ~8 s): the L40S meets the budget, so it goes there
    backed_up = [replace(fast_idle[0], inflight_prefill_tokens=100_000, num_waiting=1), fast_idle[1]]
    assert s.decide(request(tokens(1, 8), **req), backed_up, 0.0).replica == "l40s"


def test_no_replica() -> None:
    s = build_policy("taskplane")
    assert s.decide(request(model="absent"), fleet(2), 0.0).action is Action.NO_REPLICA
    d = s.decide(request(), [replica("a", healthy=False)], 0.0)
    assert d.action is Action.NO_REPLICA and "healthy" in d.reason
    only = [replica("a"), replica("b")]
    assert s.decide(request(avoid_replicas=("a",)), only, 0.0).replica == "b"


@dataclass
class Cluster:
    """A tiny stand-in for the caller's in-flight bookkeeping."""

    replicas: list[ReplicaView]

    def start(self, name: str) -> None:
        self.replicas = [replace(r, num_waiting=r.num_waiting + 1) if r.name == name else r for r in self.replicas]

    def finish(self, name: str) -> None:
        self.replicas = [replace(r, num_waiting=r.num_waiting - 1) if r.name == name else r for r in self.replicas]


def test_admission_queues_when_saturated_and_critical_overtakes() -> None:
    s = build_policy("taskplane")
    c = Cluster(fleet(2))
    placed = []
    for i in range(4):  # two per replica saturates both (max_waiting_per_replica=2)
        d = s.decide(request(tokens(i, 2), call_id=f"w{i}"), c.replicas, 0.0)
        assert d.action is Action.PLACE
        c.start(d.replica or "")
        placed.append(d.replica)
    batch = [request(tokens(10 + i, 2), call_id=f"b{i}", priority="batch") for i in range(3)]
    for r in batch:
        assert s.decide(r, c.replicas, 1.0).action is Action.QUEUE
    crit = request(tokens(20, 2), call_id="crit", priority="critical")
    assert s.decide(crit, c.replicas, 2.0).action is Action.QUEUE
    assert s.queue_depths()["m"] == {"critical": 1, "interactive": 0, "standard": 0, "batch": 3}
    assert s.release(c.replicas, 2.5) == []  # still saturated: nothing moves
    c.finish(placed[0] or "")
    out = s.release(c.replicas, 3.0)
    assert [(r.call_id, d.action) for r, d in out] == [("crit", Action.PLACE)]
    # the release accounted for its own placement: the freed slot is taken again
    c.start(out[0][1].replica or "")
    c.finish(placed[1] or "")
    c.finish(placed[2] or "")
    out = s.release(c.replicas, 4.0)
    assert [r.call_id for r, _ in out] == ["b0", "b1"]
    assert s.queued == 1
    assert s.cancel(batch[2]) and s.queued == 0


def test_new_call_does_not_jump_queued_equal_priority_work() -> None:
    s = build_policy("taskplane")
    sat = fleet(1, num_waiting=2)
    assert s.decide(request(call_id="first"), sat, 0.0).action is Action.QUEUE
    free = fleet(1)
    assert s.decide(request(call_id="second"), free, 1.0).action is Action.QUEUE
    assert [r.call_id for r, _ in s.release(free, 1.0)][:1] == ["first"]
    # a more urgent call is not held behind less urgent queued work
    s2 = build_policy("taskplane")
    s2.decide(request(call_id="b", priority="batch"), sat, 0.0)
    assert s2.decide(request(call_id="i", priority="interactive"), free, 1.0).action is Action.PLACE


def test_shed_when_deadline_cannot_survive_the_queue() -> None:
    s = build_policy("taskplane")
    sat = fleet(2, num_waiting=2, num_running=4)
    for i in range(50):
        s.decide(request(tokens(i, 4), priority="standard"), sat, 0.0)
    d = s.decide(request(tokens(99, 4), priority="batch", budget_ms=3_000), sat, 0.0)
    assert d.action is Action.SHED and d.retry_after_s is not None and d.retry_after_s >= 1
    # critical work is never shed: it queues ahead of everything
    crit = s.decide(request(tokens(98, 4), priority="critical", budget_ms=3_000), sat, 0.0)
    assert crit.action is Action.QUEUE


def test_queued_call_past_its_deadline_is_released_as_unmeetable() -> None:
    s = build_policy("taskplane")
    sat = fleet(1, num_waiting=2)
    r = request(priority="critical", budget_ms=5_000)
    assert s.decide(r, sat, 0.0).action is Action.QUEUE
    out = s.release(sat, 10.0)
    assert [(x.call_id, d.action) for x, d in out] == [(r.call_id, Action.UNMEETABLE)]


def test_full_queue_displaces_least_valuable() -> None:
    from taskplane.scheduler.flowcontrol.settings import AdmissionSettings

    s = build_scheduler(policy="taskplane", admission=AdmissionSettings(max_queue=2))
    sat = fleet(1, num_waiting=2)
    cheap = request(call_id="cheap", priority="batch")
    s.decide(cheap, sat, 0.0)
    s.decide(request(call_id="b2", priority="batch", sunk_cost_usd=1.0), sat, 0.0)
    assert s.decide(request(call_id="b3", priority="batch"), sat, 0.0).action is Action.SHED  # not better
    assert s.decide(request(call_id="std"), sat, 0.0).action is Action.QUEUE
    out = s.release(sat, 0.5)
    assert [(x.call_id, d.action) for x, d in out] == [("cheap", Action.SHED)]


def test_observe_completion_calibrates_latency() -> None:
    s = build_policy("taskplane")
    prior = s.latency.timing("h100")
    pool = [replica("a")]
    toks = tokens(1, 128)  # 2048 tokens
    for i in range(60):
        req = request(toks, call_id=f"c{i}")
        d = s.decide(req, pool, float(i))
        # the real replica prefills at half the prior rate and decodes 1.5x slower
        ttft = 2048 / (prior.prefill_tokens_per_s / 2) + prior.decode_base_ms / 1000
        decode = 63 * (prior.decode_base_ms + prior.decode_per_seq_ms) * 1.5 / 1000
        s.observe_completion(
            req,
            CallOutcome(replica=d.replica or "", prompt_tokens=2048, completion_tokens=64, ttft_s=ttft,
                        total_s=ttft + decode, batch_size=1),
            float(i) + 1,
        )
    cal = s.latency.timing("h100")
    assert cal.prefill_tokens_per_s == pytest.approx(prior.prefill_tokens_per_s / 2, rel=0.1)
    assert cal.decode_base_ms == pytest.approx(prior.decode_base_ms * 1.5, rel=0.1)
    assert s.latency.expected_completion_tokens("m", 4096) == pytest.approx(64, rel=0.05)
    assert s.latency.timing("l40s") == s.latency.priors["l40s"]  # other GPUs untouched


def test_decisions_are_counted() -> None:
    s = build_policy("least-loaded")
    before = PROM.get_sample_value("taskplane_scheduler_decisions_total", {"policy": "least-loaded", "action": "place"}) or 0
    s.decide(request(), fleet(2), 0.0)
    after = PROM.get_sample_value("taskplane_scheduler_decisions_total", {"policy": "least-loaded", "action": "place"})
    assert after == before + 1
    assert PROM.get_sample_value(
        "taskplane_scheduler_plugin_score_count", {"policy": "least-loaded", "plugin": "least-loaded"}
    )


def test_same_seed_same_decisions() -> None:
    def run(seed: int) -> list[str | None]:
        s = build_policy("taskplane", seed=seed)
        pool = fleet(6)
        return [s.decide(request(tokens(i % 5, 3), session_id=f"s{i % 7}"), pool, float(i)).replica for i in range(40)]

    assert run(5) == run(5)
