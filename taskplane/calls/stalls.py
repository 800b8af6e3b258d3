"""A clock for attempt durations that leaves out the gateway's own stalls.

An attempt is charged the GPU time of its share of the replica's batch over its
duration. The duration is what the gateway saw; if the gateway itself stood still
(SIGSTOP, a VM pause, swapped out) the answer sat in socket buffers meanwhile, and the
wall clock would charge the tenant for the pause: a gateway paused 20 s charged its
in-flight attempts 21 s each, 5-10x their real cost. When the replica finished during
the pause is unknown, so the pause is not charged at all (as ``lost.py`` never charges
time the gateway cannot vouch for).

A daemon thread ticks every ``TICK_S``; a tick that comes more than ``STALL_S`` late
means the process did not run, and the lateness is added to ``stalled``. ``now()`` is
monotonic time minus the stalls so far, including one still being noticed (the first
code to run after a pause may be the one that ends an attempt, before the ticker).
"""

from __future__ import annotations

import threading
import time

TICK_S = 0.05
#: Lateness of a tick below this is scheduling noise on a busy host, not a stall.
STALL_S = 1.0


class StallClock:
    """Monotonic seconds during which this process was running (see the module docstring)."""

    def __init__(self, *, tick_s: float = TICK_S, stall_s: float = STALL_S) -> None:
        self.tick_s = tick_s
        self.stall_s = stall_s
        self.stalled = 0.0  # seconds of stalls seen so far
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while True:
            time.sleep(self.tick_s)
            self._tick()

    def _tick(self) -> None:
        with self._lock:
            now = time.monotonic()
            late = now - self._last - self.tick_s
            if late > self.stall_s:
                self.stalled += late
            self._last = now

    def now(self) -> float:
        """Monotonic time less the process's stalls (starts the ticker on first use)."""
        if self._thread is None:
            self._start()
        with self._lock:
            t = time.monotonic()
            pending = t - self._last - self.tick_s
            return t - self.stalled - (pending if pending > self.stall_s else 0.0)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._last = time.monotonic()
                self._thread = threading.Thread(target=self._run, name="stall-clock", daemon=True)
                self._thread.start()


#: The process's clock (one ticker thread per process).
CLOCK = StallClock()
