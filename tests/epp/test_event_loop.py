"""The front door's event loop: uvloop by default, asyncio's own on request."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from taskplane.epp.loop import loop_factory, run


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TASKPLANE_EVENT_LOOP", raising=False)
    assert loop_factory() is uvloop.new_event_loop
    assert run(_loop_module()).startswith("uvloop")


def test_asyncio_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKPLANE_EVENT_LOOP", "asyncio")
    assert loop_factory() is None
    assert run(_loop_module()).startswith("asyncio")


def test_unknown_loop_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKPLANE_EVENT_LOOP", "trio")
    with pytest.raises(ValueError, match="uvloop or asyncio"):
        loop_factory()
