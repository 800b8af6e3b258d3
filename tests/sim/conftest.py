"""Real ``taskplane sim-engine`` processes on free ports, stopped after each test."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from taskplane.ports import free_port


def free_port_pair() -> tuple[int, int]:
    """A PUB port whose replay port (+1000) is free as well."""
    for _ in range(50):
        p = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", p + 1000))
            except OSError:
                continue
        return p, p + 1000
    raise RuntimeError("no free port pair")


@dataclass
class SimProc:
    proc: subprocess.Popen[bytes]
    url: str
    kv_port: int
    replay_port: int
    model: str = "llama-3.1-8b"
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def kv_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.kv_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def start_sim(*args: str, speed: float = 50.0, wait: bool = True) -> SimProc:
    port = free_port()
    kv_port, replay = free_port_pair()
    cmd = [sys.executable, "-m", "taskplane.cli", "sim-engine", "--port", str(port),
           "--kv-events-port", str(kv_port), "--speed", str(speed), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    sim = SimProc(proc=proc, url=f"http://127.0.0.1:{port}", kv_port=kv_port, replay_port=replay)
    if wait:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"sim-engine exited early: {err}")
            try:
                if httpx.get(f"{sim.url}/v1/models", timeout=1).status_code == 200:
                    return sim
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        sim.stop()
        raise RuntimeError("sim-engine did not come up in 30 s")
    return sim


@pytest.fixture
def sim_factory() -> Iterator[Callable[..., SimProc]]:
    started: list[SimProc] = []

    def make(*args: str, speed: float = 50.0) -> SimProc:
        s = start_sim(*args, speed=speed)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


@pytest.fixture
def sim(sim_factory: Callable[..., SimProc]) -> SimProc:
    return sim_factory()
