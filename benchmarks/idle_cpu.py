"""The front door's CPU with no calls at all: what the picker's process (and Envoy) spend
per second on scrapes, polls, timers and KV-event ingestion, by thread. At agent rates
(~25 calls/s) this fixed cost is divided by the call rate and lands in "CPU per call".

    python -m benchmarks.idle_cpu --seconds 30 [--postgres] [--replicas 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from taskplane.bench.live_stack import embedded_postgres
from taskplane.dev.local import LocalCluster


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) by thread name (threads of one name summed)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def process_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the gateway's process and of its children (Envoy), by name."""
    proc = psutil.Process(pid)
    out = {"picker": sum(proc.cpu_times()[:2])}
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            out[child.name()] = out.get(child.name(), 0.0) + sum(child.cpu_times()[:2])
    return out


def measure(pid: int, seconds: float) -> dict[str, Any]:
    """CPU ms per second over ``seconds`` of idleness, by process and by the picker's threads."""
    p0, t0, w0 = process_cpu(pid), thread_cpu(pid), time.monotonic()
    time.sleep(seconds)
    p1, t1, wall = process_cpu(pid), thread_cpu(pid), time.monotonic() - w0
    per_s = {k: round((v - p0.get(k, 0.0)) * 1000.0 / wall, 2) for k, v in p1.items()}
    threads = {k: round((v - t0.get(k, 0.0)) * 1000.0 / wall, 2) for k, v in t1.items() if v - t0.get(k, 0.0) > 0}
    return {"wall_s": round(wall, 1), "cpu_ms_per_s": per_s, "picker_threads_cpu_ms_per_s": threads,
            "load_average_1m": round(os.getloadavg()[0], 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--postgres", action="store_true", help="an embedded Postgres for the gateway's rows")
    p.add_argument("--settle-s", type=float, default=5.0, help="wait after start before measuring")
    p.add_argument("--pause", action="store_true", help="print the gateway's pid and wait for Enter (to attach a profiler)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tp-idle-") as tmp, contextlib.ExitStack() as stack:
        wd = Path(tmp)
        url = stack.enter_context(embedded_postgres(wd)) if args.postgres else None
        cluster = stack.enter_context(LocalCluster(wd, replicas=args.replicas, speed=1.0, kv_blocks=4096, database_url=url))
        assert cluster.gateway_pid is not None
        time.sleep(args.settle_s)
        if args.pause:
            input(f"gateway pid {cluster.gateway_pid}; Enter to measure ")
        print(json.dumps(measure(cluster.gateway_pid, args.seconds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
