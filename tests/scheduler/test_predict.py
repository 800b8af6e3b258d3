"""The prediction layer learns from history, grows sure with evidence, and says when it is not."""

from __future__ import annotations

import random
from typing import Any

import pytest

from taskplane.scheduler.predict import (
    GapModel,
    OutputModel,
    Prediction,
    Predictor,
    StepsModel,
    TaskHistory,
    evidence,
)


def test_evidence_rises_with_samples() -> None:
    assert evidence(0, 10) == 0.0
    assert evidence(10, 10) == pytest.approx(0.5)
    assert evidence(5, 10) < evidence(50, 10) < evidence(500, 10) < 1.0


def test_steps_left_learns_the_conditional_remaining_calls() -> None:
    m = StepsModel(min_samples=5)
    for total in [4] * 50 + [10] * 50:
        m.observe_total("coder", "acme", total)
    # at call 0 half go to 4 calls, half to 10: 3 or 9 left
    assert m.steps_left("coder", "acme", 0).value == pytest.approx(6.0)
    # past call 4 only the 10-call tasks remain: call 5 has 4 left, for sure
    p = m.steps_left("coder", "acme", 5)
    assert p.value == pytest.approx(4.0) and p.spread == pytest.approx(0.0) and p.source == "learned"
    assert m.session_end("coder", "acme", 3).value == pytest.approx(0.5)  # half of them end at call 3
    assert m.session_end("coder", "acme", 9).value == pytest.approx(1.0)
    assert m.session_end("coder", "acme", 2).value == pytest.approx(0.0)


def test_confidence_rises_with_evidence_and_falls_back_when_low() -> None:
    m = StepsModel(min_samples=5)
    none = m.session_end("triage", "t", 0)
    assert none.confidence == 0.0 and none.source == "prior" and not none.usable(0.1)
    confs = []
    for _ in range(1, 200):
        m.observe_total("triage", "t", 3)
        confs.append(m.session_end("triage", "t", 2).confidence)
    assert confs[3] == 0.0  # below min_samples: no answer
    assert confs[10] < confs[50] < confs[190]
    assert confs[190] > 0.9
    # another agent has learned nothing from triage's tasks
    assert m.steps_left("coder", "t", 0).confidence == 0.0


def test_tenant_level_falls_back_to_the_agent() -> None:
    m = StepsModel(min_samples=5)
    for _ in range(20):
        m.observe_total("coder", "big", 8)
    p = m.steps_left("coder", "new-tenant", 0)
    assert p.value == pytest.approx(7.0) and p.confidence > 0.5


def test_a_wrong_author_loses_to_history_an_exact_one_wins() -> None:
    rng = random.Random(1)
    wrong, exact = StepsModel(), StepsModel()
    for _ in range(200):
        total = rng.randint(8, 60)
        for m, hinted in ((wrong, 34), (exact, total)):
            m.observe_total("coder", "t", total)
            m.observe_hint("coder", hinted, total)
    assert wrong.hint_confidence("coder") < 0.7
    assert exact.hint_confidence("coder") > 0.95
    # at call 40 the author of "34 steps" says 0 left; history knows better
    p = wrong.session_end("coder", "t", 40, hint=0)
    assert p.source == "learned" and p.value < 0.2
    q = exact.session_end("coder", "t", 40, hint=0)
    assert q.source == "hint" and q.value == 1.0


def test_an_unchecked_hint_is_trusted_at_the_prior() -> None:
    p = StepsModel(hint_prior=0.5).steps_left("coder", "t", 3, hint=7)
    assert p == Prediction(7.0, 0.5, 0, "hint")


def test_predictor_infers_ends_of_idle_conversations_and_takes_them_back() -> None:
    pr = Predictor(idle_end_s=100.0)
    for i in range(30):
        pr.observe_call(f"s{i}", agent="chat", tenant="d", step=None, now_s=float(i))
    assert pr.session_end("chat", "d", 0).confidence == 0.0  # nothing ended yet
    pr.observe_call("late", agent="chat", tenant="d", step=None, now_s=500.0)  # time passes: 30 idle ones end
    p = pr.session_end("chat", "d", 0)
    assert p.value == pytest.approx(1.0) and p.samples == 30
    # one comes back: it had not ended after one call
    assert pr.observe_call("s0", agent="chat", tenant="d", step=None, now_s=501.0) == 1
    assert pr.session_end("chat", "d", 0).value == pytest.approx(29 / 29)  # s0 no longer a 1-call total
    assert pr.steps.session_end("chat", "d", 0).samples == 29


def test_reported_task_ends_teach_totals_and_hint_accuracy() -> None:
    pr = Predictor()
    for t in range(20):
        for step in range(5):
            pr.observe_call(f"task{t}", agent="a", tenant="x", step=step, now_s=t * 10.0 + step, hint=9 - step)
        pr.task_ended(f"task{t}", calls=5)
    assert pr.steps_left("a", "x", 2).value == pytest.approx(2.0)
    assert pr.steps.hint_confidence("a") < 0.5  # it said 10 calls, tasks made 5


def test_seed_from_history() -> None:
    pr = Predictor()
    n = pr.seed(TaskHistory("a", "x", calls=3, output_tokens=(100, 120), gaps_s=(("pytest", 4.0),))
                for _ in range(30))
    assert n == 30
    assert pr.session_end("a", "x", 2).value == pytest.approx(1.0)
    assert pr.output_tokens("a", cap=1000).value == pytest.approx(110.0)
    assert pr.tool_gap("a", "pytest").value == pytest.approx(4.0)


def test_gaps_tool_then_agent_then_default() -> None:
    g = GapModel(default_s=2.0, min_samples=3)
    assert g.predict("a", "t") == Prediction(2.0, 0.0, 0, "prior", 2.0)
    for x in (1.0, 2.0, 3.0):
        g.observe("a", "t", x)
    p = g.predict("a", "t")
    assert p.value == pytest.approx(2.0) and p.spread == pytest.approx(1.0) and p.confidence > 0
    assert g.predict("a", "other").value == pytest.approx(2.0)  # the agent's level


def test_outputs_capped_and_learned() -> None:
    o = OutputModel(min_samples=5)
    assert o.predict("a", None, cap=512).confidence == 0.0
    for _ in range(10):
        o.observe("a", "search", 300)
    assert o.predict("a", "search", cap=200).value == 200.0
    assert o.predict("a", "search").value == pytest.approx(300.0)
    assert o.predict("b", None).value == pytest.approx(300.0)  # over all calls


def test_remaining_work_scales_steps_left() -> None:
    pr = Predictor()
    for _ in range(30):
        pr.steps.observe_total("a", "x", 6)
    w = pr.remaining_work("a", "x", 1, tokens_per_call=1000.0)
    assert w.value == pytest.approx(4000.0) and w.confidence > 0.5


def _scorer(predict_end: bool) -> Any:
    import numpy as np

    from taskplane.scheduler.framework.handle import Handle
    from taskplane.scheduler.kvindex import KVIndex
    from taskplane.scheduler.latency import LatencyModel
    from taskplane.scheduler.scorers.session import SessionAffinityParams, SessionAffinityScorer

    scorer = SessionAffinityScorer(SessionAffinityParams(predict_end=predict_end), policy="t")
    handle = Handle(kv_index=KVIndex(metrics=False), latency=LatencyModel(), tenants={}, rng=np.random.default_rng(0),
                    metrics=False)
    scorer.bind(handle)
    handle.predictor.seed(TaskHistory("coder", "acme", calls=3) for _ in range(40))  # coder tasks make 3 calls
    return scorer


def _ended(scorer: Any, step: int, hint: int | None) -> bool:
    from taskplane.scheduler.types import CallOutcome, CallRequest

    scorer.pins.placed("s1", "r1", 0.0, "coder", tokens=100, calls=1.0)
    req = CallRequest(model="m", prompt_tokens=100, max_tokens=10, session_id="s1", task_id="s1", agent="coder",
                      tenant="acme", step=step, steps_remaining=hint, call_id=f"c{step}")
    scorer.completed(req, CallOutcome(replica="r1"), 1.0)
    return scorer.pins.get("s1", 1.0) is None


def test_pins_end_where_the_prediction_says_not_where_the_hint_says() -> None:
    # the author's "5 steps" hint says 2 left after call 2; history says coder tasks end there
    assert _ended(_scorer(predict_end=True), 2, hint=2)
    assert not _ended(_scorer(predict_end=False), 2, hint=2)  # the hint alone keeps the pin
    assert not _ended(_scorer(predict_end=True), 1, hint=None)  # call 1 is never the last
    assert _ended(_scorer(predict_end=False), 1, hint=0)  # a hint of 0 ends it, right or wrong
