"""Admission ordering: bands, EDF inside a band, weighted fair share, victims, expiry."""

from __future__ import annotations

import math

from _sched_util import request

from taskplane.scheduler.flowcontrol.queue import AdmissionQueue
from taskplane.scheduler.flowcontrol.settings import band_rank, check_priority_cap


def drain(q: AdmissionQueue) -> list[str]:
    out = []
    while (e := q.pop()) is not None:
        out.append(e.call.call_id or "")
    return out


def test_critical_overtakes_batch() -> None:
    q = AdmissionQueue("m")
    for i in range(5):
        q.push(request(call_id=f"b{i}", priority="batch"), now_s=float(i))
    q.push(request(call_id="std", priority="standard"), now_s=6.0)
    q.push(request(call_id="crit", priority="critical"), now_s=7.0)
    assert q.peek().call.call_id == "crit"  # type: ignore[union-attr]
    assert drain(q) == ["crit", "std", "b0", "b1", "b2", "b3", "b4"]


def test_edf_inside_a_band() -> None:
    q = AdmissionQueue("m")
    q.push(request(call_id="none"), now_s=0.0)
    q.push(request(call_id="late", budget_ms=30_000), now_s=0.0)
    q.push(request(call_id="soon", budget_ms=10_000), now_s=0.0)
    q.push(request(call_id="mid", budget_ms=15_000), now_s=1.0)  # deadline 16 s
    assert drain(q) == ["soon", "mid", "late", "none"]


def test_sunk_cost_breaks_ties() -> None:
    q = AdmissionQueue("m")
    q.push(request(call_id="fresh"), now_s=0.0)
    q.push(request(call_id="expensive", sunk_cost_usd=3.0, step=8, steps_remaining=1), now_s=1.0)
    assert drain(q) == ["expensive", "fresh"]


def test_weighted_fair_share_between_tenants() -> None:
    q = AdmissionQueue("m", weight_of={"a": 2.0, "b": 1.0}, fair_unit="calls")
    for i in range(30):
        q.push(request(call_id=f"a{i}", tenant="a"), now_s=0.0)
        q.push(request(call_id=f"b{i}", tenant="b"), now_s=0.0)
    first = drain(q)[:30]
    served_a = sum(1 for c in first if c.startswith("a"))
    assert served_a == 20  # 2:1 while both have work
    # inside each tenant: first come first served (no deadlines)
    assert [c for c in first if c.startswith("a")] == [f"a{i}" for i in range(20)]


def test_fair_share_by_tokens_and_no_idle_credit() -> None:
    q = AdmissionQueue("m", fair_unit="tokens")
    for i in range(10):
        q.push(request(call_id=f"big{i}", tenant="big", max_tokens=10_000), now_s=0.0)
        q.push(request(call_id=f"small{i}", tenant="small", max_tokens=64), now_s=0.0)
    order = [q.pop().call.call_id for _ in range(12)]  # type: ignore[union-attr]
    assert sum(1 for c in order if c and c.startswith("big")) <= 2  # big calls cost more share
    # a tenant arriving after a long absence does not monopolise the band
    q2 = AdmissionQueue("m", fair_unit="calls")
    for i in range(20):
        q2.push(request(call_id=f"x{i}", tenant="x"), now_s=0.0)
    for _ in range(10):
        q2.pop()
    for i in range(10):
        q2.push(request(call_id=f"y{i}", tenant="y"), now_s=0.0)
    nxt = [q2.pop().call.call_id for _ in range(6)]  # type: ignore[union-attr]
    assert sum(1 for c in nxt if c and c.startswith("x")) >= 2


def test_bands_isolate_fair_share() -> None:
    q = AdmissionQueue("m", weight_of={"a": 100.0}, fair_unit="calls")
    q.push(request(call_id="a-batch", tenant="a", priority="batch"), now_s=0.0)
    q.push(request(call_id="b-std", tenant="b", priority="standard"), now_s=0.0)
    assert drain(q) == ["b-std", "a-batch"]


def test_victim_and_remove_and_expiry() -> None:
    q = AdmissionQueue("m")
    keep = request(call_id="keep", priority="batch", sunk_cost_usd=5.0)
    cheap = request(call_id="cheap", priority="batch")
    q.push(keep, now_s=0.0)
    q.push(cheap, now_s=0.0)
    q.push(request(call_id="std", priority="standard"), now_s=0.0)
    assert q.victim().call.call_id == "cheap"  # type: ignore[union-attr]
    assert q.remove(cheap) is not None and cheap not in q
    assert q.depths() == {"critical": 0, "interactive": 0, "standard": 1, "batch": 1}
    doomed = request(call_id="doomed", budget_ms=2_000)
    q.push(doomed, now_s=10.0, service_s=1.5)
    assert q.expired(10.4) == []
    gone = q.expired(10.6)  # 10.6 + 1.5 > 12.0
    assert [e.call.call_id for e in gone] == ["doomed"] and len(q) == 2
    assert drain(q) == ["std", "keep"]


def test_priority_cap_and_rank() -> None:
    assert check_priority_cap("standard", "interactive")
    assert check_priority_cap("interactive", "interactive")
    assert not check_priority_cap("critical", "interactive")
    assert band_rank("bogus") == band_rank("standard")
    assert math.isinf(AdmissionQueue("m").push(request(), 0.0).deadline_s)
