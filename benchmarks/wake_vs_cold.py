"""Hot start against cold start on the simulated replica over HTTP, alternated, one run:
the wall time from the decision to the first served call, for (a) a new
``sim-engine --cold-start-s C`` process (process start + the modelled weight load and engine
start) and (b) a sleeping ``sim-engine --enable-sleep-mode`` woken by ``POST /wake_up`` (the
modelled level-1 or level-2 wake). Times scale with ``--speed`` (virtual = wall x speed);
both are the simulator's model, not a GPU's measurement.

    .venv/bin/python -m benchmarks.wake_vs_cold --speed 5 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import httpx

from taskplane.ports import free_port
from taskplane.sim.gpus import default_cold_start_s

MODEL = "llama-3.1-8b"
BODY = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}


def _spawn(port: int, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "taskplane.cli", "sim-engine", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _first_call(url: str, deadline_s: float = 120.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if httpx.post(f"{url}/v1/chat/completions", json=BODY, timeout=60).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} never served")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--speed", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--level", type=int, default=1)
    a = ap.parse_args()
    cold_s = default_cold_start_s("h100", MODEL)
    port = free_port()
    sleeper = _spawn(port, "--enable-sleep-mode", "--speed", str(a.speed))
    url = f"http://127.0.0.1:{port}"
    _first_call(url)
    cold: list[float] = []
    hot: list[float] = []
    try:
        for _ in range(a.rounds):
            p = free_port()
            t0 = time.monotonic()
            fresh = _spawn(p, "--cold-start-s", str(cold_s), "--speed", str(a.speed))
            try:
                _first_call(f"http://127.0.0.1:{p}")
                cold.append(time.monotonic() - t0)
            finally:
                fresh.terminate()
                fresh.wait(10)
            httpx.post(f"{url}/sleep", params={"level": a.level}, timeout=60)
            t0 = time.monotonic()
            httpx.post(f"{url}/wake_up", timeout=60)
            _first_call(url)
            hot.append(time.monotonic() - t0)
    finally:
        sleeper.terminate()
        sleeper.wait(10)
    c, h = statistics.median(cold), statistics.median(hot)
    print(f"speed {a.speed:g}: cold start (new process, modelled {cold_s:.1f} s load) median {c:.2f} s wall "
          f"{[round(x, 2) for x in cold]}; level-{a.level} wake median {h:.2f} s wall {[round(x, 2) for x in hot]}; "
          f"cold/hot x{c / h:.1f}")


if __name__ == "__main__":
    main()
