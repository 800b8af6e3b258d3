"""Python's full garbage collections off the burst's path.

A full (generation 2) collection walks every container object the process holds and
stops the event loop meanwhile: in the front door's process, 80-250 ms, once in about
every other 200-stream burst, so every call waiting for its routing answer waited that
much longer (``taskplane_epp_gc_seconds``). Most of what it walks is what start-up built
and never frees (modules, classes, the configuration, the app); ``gc.freeze()`` moves
those objects out of the collector's reach for good (they are still freed by reference
counting; only a garbage cycle among them would stay), so later collections walk only
what the running process made since.
"""

from __future__ import annotations

import gc
import os

#: ``0`` leaves the collector as Python sets it (the bench's comparison).
FREEZE_ENV = "TASKPLANE_EPP_GC_FREEZE"


def freeze_startup_objects() -> int:
    """Collect once, then freeze what survived (unless ``TASKPLANE_EPP_GC_FREEZE=0``);
    the number of objects frozen (0: left as it was)."""
    if os.environ.get(FREEZE_ENV, "1") == "0":
        return 0
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
