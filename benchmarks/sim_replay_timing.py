"""Wall time of the cluster simulator on the Mooncake trace (a benchmark, not a test).

    python -m benchmarks.sim_replay_timing [--trace FILE] [--replicas 16] [--policy round-robin]
                                   [--duration-s 3600] [--time-scale 1.0]

Prints one JSON object: wall seconds to load the trace and to simulate it, the virtual
time covered, calls and the headline metrics of the run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from taskplane.scheduler.policies import build_policy
from taskplane.sim.cluster import ClusterSpec, round_robin, simulate
from taskplane.sim.workloads.mooncake import load_mooncake

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def time_mooncake_replay(
    trace: str | Path = DEFAULT_TRACE,
    *,
    replicas: int = 16,
    gpu: str = "h100",
    policy: str = "round-robin",
    duration_s: float | None = None,
    time_scale: float = 1.0,
    seed: int = 1,
) -> dict[str, Any]:
    """Replay the trace on ``replicas`` simulated GPUs and report how long it took."""
    t0 = time.perf_counter()
    wl = load_mooncake(trace, duration_s=duration_s, time_scale=time_scale)
    t1 = time.perf_counter()
    pol: Any = round_robin() if policy == "round-robin-plain" else build_policy(policy, seed=seed, metrics=False)
    res = simulate(ClusterSpec.fleet(f"{gpu}:{replicas}"), wl, pol, seed=seed)
    t2 = time.perf_counter()
    return {
        "trace": str(trace), "replicas": replicas, "gpu": gpu, "policy": policy,
        "requests": wl.num_calls, "sessions": len(wl.tasks),
        "load_wall_s": round(t1 - t0, 3), "simulate_wall_s": round(t2 - t1, 3),
        "virtual_s": round(res.end_s, 1), "speedup": round(res.end_s / max(t2 - t1, 1e-9), 1),
        **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.summary().items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--policy", default="round-robin",
                    help="a scheduler preset, or round-robin-plain (no scheduler, no KV events)")
    ap.add_argument("--duration-s", type=float, default=None)
    ap.add_argument("--time-scale", type=float, default=1.0)
    a = ap.parse_args()
    print(json.dumps(time_mooncake_replay(a.trace, replicas=a.replicas, gpu=a.gpu, policy=a.policy,
                                          duration_s=a.duration_s, time_scale=a.time_scale), indent=2))


if __name__ == "__main__":
    main()
