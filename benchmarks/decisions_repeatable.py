"""``python -m benchmarks.picker_decisions`` made repeatable, for callgrind's instruction counts.

Under valgrind (about 50x slower) session pins and tool-gap TTLs expire at other points
than at full speed and from one run to the next (about 1.5 % between runs of the same
code, docs/benchmarks.md). Here ``time.monotonic`` is a virtual clock that advances 10 us
per read, and the caller sets ``PYTHONHASHSEED=0``; two runs of the same code then agreed
within 0.4-1.1 % (call ids stay random). The figure is the difference of a 400- and a
100-call run over 300 (start-up cancels). Run it from the root of the tree to measure
(``PYTHONPATH=.`` keeps that tree ahead of the venv's editable install):

    PYTHONPATH=. PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python -m benchmarks.decisions_repeatable --calls 100   # and --calls 400
        # --stream: streamed calls as taskplane's Envoy sends them

``--gc-off`` and ``--no-metrics`` are what-ifs (what the cyclic GC and the Prometheus
updates cost per decision), not configurations.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time

_clock = [time.monotonic()]


def _virtual_monotonic() -> float:
    _clock[0] += 1e-5
    return _clock[0]


def _no_metrics() -> None:
    from prometheus_client.metrics import Counter, Gauge, Histogram

    Counter.inc = lambda self, amount=1, exemplar=None: None  # type: ignore[assignment,method-assign]
    Gauge.set = lambda self, value: None  # type: ignore[assignment,method-assign]
    Gauge.inc = lambda self, amount=1: None  # type: ignore[assignment,method-assign]
    Gauge.dec = lambda self, amount=1: None  # type: ignore[assignment,method-assign]
    Histogram.observe = lambda self, amount, exemplar=None: None  # type: ignore[assignment,method-assign]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--replicas", type=int, default=256)
    p.add_argument("--gc-off", action="store_true")
    p.add_argument("--no-metrics", action="store_true")
    p.add_argument("--stream", action="store_true",
                   help="streamed calls as taskplane's Envoy sends them (``benchmarks.picker_decisions``); default unary")
    args = p.parse_args()
    time.monotonic = _virtual_monotonic  # before the picker's modules read the clock
    from benchmarks import picker_decisions as decisions
    from taskplane.logs import configure_logging

    configure_logging("warning")
    if args.gc_off:
        gc.disable()
    if args.no_metrics:
        _no_metrics()
    print(json.dumps(asyncio.run(decisions.measure(args.replicas, args.calls, args.stream))))


if __name__ == "__main__":
    main()
