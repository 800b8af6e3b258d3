"""Where a call's first token waits, as the picker can see it: debug metrics.

Three views, each cheap enough to stay on:

- ``taskplane_epp_decision_seconds``: from the moment the picker's coroutine got an
  ext_proc stream's first message to the moment its routing answer was built (two
  messages apart on taskplane's Envoy: the request headers' reply and the body's wait,
  admission, the placement and the answer's encoding are inside);
- ``taskplane_epp_route_seconds``: from the message that completed the request (the body's
  last) reaching the picker's code to the routing answer built: the picker's own work and
  admission's hold, without the client's upload;
- ``taskplane_epp_reply_wait_seconds``: how long each reply up to the routing answer held
  its stream's coroutine in ``yield`` (gRPC's write, then the loop's turn back to it): the
  coroutine reads the body's message only after the headers' reply came back this way;
- ``taskplane_epp_call_phase_seconds{phase}``: Envoy's own clock for each logged call, read
  from its access-log entry: ``received`` (the request's last byte from the client),
  ``routed`` (from there to the first byte sent to the replica: every ext_proc round trip,
  the picker's event loop queue in front of them, the upstream connection), ``replica``
  (from the first byte sent to the first byte back: the replica's own response headers),
  ``first_token`` (from the request's start to the first content event, the Lua filter's
  clock), so ``routed`` minus ``decision`` is the wait outside the picker's code;
- ``taskplane_epp_loop_lag_seconds``: how late a short sleep of the picker's event loop
  wakes (``loop_probe``, off unless ``TASKPLANE_EPP_LOOP_PROBE_S`` sets its period): what
  any message arriving then waits before its coroutine runs.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram

#: Sub-millisecond to seconds, about x1.6 apart: a burst's waits sit between 0.5 and 500 ms.
BUCKETS = (0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.0025, 0.004, 0.006, 0.01, 0.015, 0.025, 0.04, 0.06,
           0.1, 0.15, 0.25, 0.4, 0.6, 1.0, 1.5, 2.5, 4.0, 6.0, 10.0)
PHASES = ("received", "routed", "replica", "first_token")
#: The environment variable that turns the loop probe on (its period in seconds).
PROBE_ENV = "TASKPLANE_EPP_LOOP_PROBE_S"


class BurstTiming:
    """The picker's timing histograms, on the gateway's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decision = Histogram("taskplane_epp_decision_seconds", "From an ext_proc stream's first message reaching the "
                                  "picker's code to its routing answer handed to gRPC", registry=registry, buckets=BUCKETS)
        phases = Histogram("taskplane_epp_call_phase_seconds", "Envoy's clock per logged call: received (the request's "
                           "last byte), routed (to the first byte sent upstream), replica (to the first byte back), "
                           "first_token (from the request's start)", ["phase"], registry=registry, buckets=BUCKETS)
        self._phase = {p: phases.labels(p) for p in PHASES}
        self.route = Histogram("taskplane_epp_route_seconds", "From the ext_proc message that completed the request "
                               "reaching the picker's code to its routing answer built", registry=registry, buckets=BUCKETS)
        self.reply_wait = Histogram("taskplane_epp_reply_wait_seconds", "How long handing a reply to gRPC held an "
                                    "ext_proc stream's coroutine (its write, then the event loop's turn back), up to "
                                    "the routing answer", registry=registry, buckets=BUCKETS)
        gc_pause = Histogram("taskplane_epp_gc_seconds", "Python's garbage collections in the picker's process, by "
                             "generation (TASKPLANE_EPP_LOOP_PROBE_S): the loop stands still meanwhile", ["generation"],
                             registry=registry, buckets=BUCKETS)
        self._gc = {g: gc_pause.labels(str(g)) for g in (0, 1, 2)}
        self.gc_frozen = Gauge("taskplane_epp_gc_frozen_objects", "Objects start-up built that Python's collector no "
                               "longer walks (gc.freeze, taskplane.epp.gcfreeze)", registry=registry)
        self._gc_started = 0.0
        self.loop_lag = Histogram("taskplane_epp_loop_lag_seconds", "How late the picker's event loop woke from a short "
                                  "sleep (TASKPLANE_EPP_LOOP_PROBE_S)", registry=registry, buckets=BUCKETS)

    def decided(self, first: float, last: float) -> None:
        """The routing answer is built: ``first`` and ``last`` (``perf_counter``) are when the
        stream's first message and the one that completed the request reached the picker."""
        now = time.perf_counter()
        self.decision.observe(now - first)
        self.route.observe(now - last)

    def logged(self, entry: Any, first_token_ms: float | None) -> None:
        """Observe one access-log entry's phases (those Envoy filled in)."""
        c = entry.common_properties
        if not (c.HasField("time_to_last_rx_byte") and c.HasField("time_to_first_upstream_tx_byte")):
            return
        rx = c.time_to_last_rx_byte.ToNanoseconds() / 1e9
        tx = c.time_to_first_upstream_tx_byte.ToNanoseconds() / 1e9
        self._phase["received"].observe(rx)
        self._phase["routed"].observe(max(0.0, tx - rx))
        if c.HasField("time_to_first_upstream_rx_byte"):
            self._phase["replica"].observe(max(0.0, c.time_to_first_upstream_rx_byte.ToNanoseconds() / 1e9 - tx))
        if first_token_ms and c.HasField("start_time"):
            start_ms = c.start_time.seconds * 1000.0 + c.start_time.nanos / 1e6
            self._phase["first_token"].observe(max(0.0, (float(first_token_ms) - start_ms) / 1000.0))


    def watch_gc(self) -> None:
        """Time every garbage collection of this process from now on (``gc.callbacks``)."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def unwatch_gc(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            self._gc[info.get("generation", 2)].observe(time.perf_counter() - self._gc_started)


async def loop_probe(lag: Histogram, period_s: float) -> None:
    """Until cancelled: sleep ``period_s`` and observe how late the loop woke."""
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(period_s)
        lag.observe(max(0.0, time.perf_counter() - t0 - period_s))


def probe_period() -> float | None:
    """The loop probe's period from ``TASKPLANE_EPP_LOOP_PROBE_S``, or None (off)."""
    value = os.environ.get(PROBE_ENV, "")
    try:
        period = float(value)
    except ValueError:
        return None
    return period if period > 0 else None
