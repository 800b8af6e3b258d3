"""Each injected fault behaves as named (set at start with --fault or at run time)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .conftest import SimProc


def _chat(sim: SimProc, content: str, timeout: float = 30, n: int = 16) -> httpx.Response:
    return httpx.post(f"{sim.url}/v1/chat/completions", timeout=timeout,
                      json={"model": sim.model, "messages": [{"role": "user", "content": content}],
                            "max_tokens": n})


def _faults(sim: SimProc, **kw: Any) -> dict[str, Any]:
    r = httpx.post(f"{sim.url}/admin/faults", json=kw, timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _busy(sim: SimProc) -> float:
    return float(httpx.get(f"{sim.url}/admin/state").json()["stats"]["busy_s"])


def test_hang_accepts_but_never_answers(sim: SimProc) -> None:
    assert _faults(sim, hang=True)["hang"] is True
    with pytest.raises(httpx.ReadTimeout):
        _chat(sim, "are you there?", timeout=1.0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{sim.url}/health", timeout=1.0)
    assert httpx.get(f"{sim.url}/admin/faults").json()["hang"] is True
    _faults(sim, clear=True)
    assert _chat(sim, "now?").status_code == 200


def test_stall_leaves_health_answering(sim: SimProc) -> None:
    assert _faults(sim, stall=True)["stall"] is True
    with pytest.raises(httpx.ReadTimeout):
        _chat(sim, "are you there?", timeout=1.0)
    assert httpx.get(f"{sim.url}/health", timeout=5.0).status_code == 200
    _faults(sim, clear=True)
    assert _chat(sim, "now?").status_code == 200


def test_slow_multiplies_engine_time(sim: SimProc) -> None:
    before = _busy(sim)
    assert _chat(sim, "a" * 300).status_code == 200
    base = _busy(sim) - before
    assert _faults(sim, slow=5)["slow"] == 5
    before = _busy(sim)
    assert _chat(sim, "b" * 300).status_code == 200  # same length, nothing cached
    slowed = _busy(sim) - before
    assert slowed == pytest.approx(5 * base, rel=1e-6)


def test_error_rate_returns_500s(sim: SimProc) -> None:
    _faults(sim, error_rate=1.0)
    r = _chat(sim, "x")
    assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
    _faults(sim, error_rate=0.5)
    codes = {_chat(sim, f"q{i}").status_code for i in range(24)}
    assert codes == {200, 500}
    _faults(sim, error_rate=0)
    assert _chat(sim, "fine").status_code == 200


def test_unknown_fault_is_a_400(sim: SimProc) -> None:
    r = httpx.post(f"{sim.url}/admin/faults", json={"melt": True})
    assert r.status_code == 400 and "unknown fault" in r.json()["error"]["message"]


def test_crash_exits_the_process(sim: SimProc) -> None:
    assert _chat(sim, "hi").status_code == 200
    _faults(sim, crash=True)
    assert sim.proc.wait(timeout=10) != 0
    with pytest.raises(httpx.ConnectError):
        _chat(sim, "hi", timeout=2)


def test_faults_at_start(sim_factory: Any) -> None:
    sim = sim_factory("--fault", "slow=3", "--fault", "crash_after=2", "--fault", "drop_events")
    f = httpx.get(f"{sim.url}/admin/faults").json()
    assert f["slow"] == 3 and f["drop_events"] == 1.0 and f["crash_after"] == 2
    assert _chat(sim, "first").status_code == 200
    with pytest.raises(httpx.TransportError):
        _chat(sim, "second", timeout=5)  # the process dies on it
    assert sim.proc.wait(timeout=10) != 0


def test_cold_start_delays_only_the_first_call(sim_factory: Any) -> None:
    sim = sim_factory("--cold-start-s", "20", speed=20.0)  # 20 virtual s = 1 wall s
    assert httpx.get(f"{sim.url}/admin/state").json()["model_loaded"] is False
    first = httpx.post(f"{sim.url}/v1/chat/completions", timeout=30, json={
        "model": sim.model, "messages": [{"role": "user", "content": "wake up"}], "max_tokens": 1})
    assert first.status_code == 200
    state = httpx.get(f"{sim.url}/admin/state").json()
    assert state["model_loaded"] is True and state["virtual_time_s"] >= 20
