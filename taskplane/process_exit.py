"""Leave the process without CPython's finalization once the Temporal client was loaded.

The Temporal SDK's Rust core keeps Tokio threads that may still release the GIL while the
interpreter finalizes, which aborts a finished command with ``Fatal Python error:
PyGILState_Release`` (temporalio/sdk-python#300, open). A command that is done has
nothing left for finalization to do but that, so we flush, run the ``atexit`` handlers
and end the process ourselves.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys

_TEMPORAL_BRIDGE = "temporalio.bridge.temporal_sdk_bridge"


def exit_code_of(exc: SystemExit) -> int:
    """``sys.exit``'s argument as the process's status: None is 0, a message is 1 (printed)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def exit_past_native_threads(code: int) -> None:
    """End the process with ``code``; skip finalization only when Temporal's core is loaded."""
    if _TEMPORAL_BRIDGE not in sys.modules:
        sys.exit(code)
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    os._exit(code)
