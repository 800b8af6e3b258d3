"""The attempt clock leaves out the time the process itself stood still (SIGSTOP): a
paused gateway must not charge its in-flight attempts for the pause."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

CHILD = textwrap.dedent("""
    import time
    from taskplane.calls.stalls import StallClock
    clock = StallClock()
    t0, w0 = clock.now(), time.monotonic()
    print("ready", flush=True)
    time.sleep(2.0)
    print(clock.now() - t0, time.monotonic() - w0, flush=True)
""")


def test_a_sigstop_is_not_counted() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(4.0)
        os.kill(child.pid, signal.SIGCONT)
        ran_s, wall_s = map(float, child.stdout.readline().split())
    finally:
        child.kill()
        child.wait()
    assert wall_s >= 4.0  # the pause was real
    assert ran_s < wall_s - 3.0  # and not counted: the child ran about 0.5-2 s of it


def test_no_stall_no_correction() -> None:
    from taskplane.calls.stalls import StallClock

    clock = StallClock()
    t0, w0 = clock.now(), time.monotonic()
    time.sleep(0.3)
    assert abs((clock.now() - t0) - (time.monotonic() - w0)) < 0.05
