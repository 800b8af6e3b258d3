"""Where the TTFT of a run goes, and the bound of an infinite cache on idle replicas.

    python -m benchmarks.ttft_anatomy mooncake [--trace FILE] [--duration-s S] [--host-kv-gb G] VARIANT...
    python -m benchmarks.ttft_anatomy agents --load L [--host-kv-gb G] [--seed N] VARIANT...

VARIANT as in benchmarks/load_balance_sweep.py (``default``, ``backlog=MS``, ``backlog=off``, a
preset name, ...). Per variant: TTFT p50 / p99 and the mean of each part (held in flow
control, engine queue, host/remote -> GPU KV loads, prefill compute) over all calls and
over the slowest 1 %; with ``--band LO HI`` (a trace), the calls between those TTFT quantiles
with prefill split into the bound, a colder prefix and contention (``anatomy.band``). For a
trace (mooncake), first the bound: every call on an idle H100
with an infinite prefix cache (benchmarks.anatomy).
"""

from __future__ import annotations

import numpy as np

from benchmarks.anatomy import PARTS, band, idle_infinite_cache_ttft_s, summarize
from benchmarks.load_balance_sweep import policy, sweep_parser, sweep_setup
from taskplane.bench.runner import run_policy
from taskplane.bench.suite import lifetimes_for


def main() -> None:
    ap = sweep_parser()
    ap.add_argument("--band", type=float, nargs=2, action="append", metavar=("LO", "HI"), default=[],
                    help="also split the calls between these TTFT quantiles (e.g. 0.4 0.6; a trace only)")
    a = ap.parse_args()
    wl, tenants, cluster = sweep_setup(a)
    if a.workload == "mooncake":
        bound = idle_infinite_cache_ttft_s(wl)
        print(f"bound: idle H100, infinite cache ({len(bound)} calls): TTFT p50 "
              f"{np.percentile(bound, 50) * 1000:.0f} p99 {np.percentile(bound, 99) * 1000:.0f} ms", flush=True)
    for v in a.variants:
        pol, preset = policy(v, a.seed, tenants)
        run = run_policy(pol, wl, cluster, seed=a.seed, kv_lifetimes=lifetimes_for(preset))
        m = summarize(run.result)
        parts = " + ".join(f"{p} {m[f'{p}_mean_ms']:.0f}" for p in PARTS)
        tail = " + ".join(f"{p} {m[f'tail_{p}_mean_ms']:.0f}" for p in PARTS)
        print(f"{v:16s} TTFT p50 {m['ttft_p50_ms']:6.0f} p99 {m['ttft_p99_ms']:6.0f} ms | mean: {parts} | "
              f"slowest 1 % ({m['tail_calls']:.0f}): {tail} ms", flush=True)
        for lo, hi in a.band if a.workload == "mooncake" else ():
            b = band(run.result, wl, lo, hi)
            split = " + ".join(f"{k} {b[f'{k}_mean_ms']:.0f}" for k in (*PARTS[:3], "bound", "colder", "contention"))
            print(f"{'':16s} band {lo:.2f}-{hi:.2f} ({b['calls']:.0f} calls, {b['first_call_share']:.0%} first calls): "
                  f"TTFT {b['ttft_mean_ms']:.0f} = {split} ms", flush=True)


if __name__ == "__main__":
    main()
