"""What an in-flight note costs (docs/reliability.md): notes opened through the real
CostWriter (fsynced SQLite, group commit) on this machine's disk, one alone and N at once.

    .venv/bin/python -m benchmarks.inflight_note_cost 1000
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from taskplane.store.writer import CostWriter


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as d:  # the working disk, not a tmpfs
        writer = CostWriter("postgresql+asyncpg://nobody@127.0.0.1:1/none", Path(d) / "outbox")
        await writer.start()
        note = '{"x": "' + "n" * 600 + '"}'  # a note is about 700 bytes of JSON
        t, c = time.perf_counter(), time.process_time()
        for i in range(50):
            await writer.open_attempt(f"seq-{i}", note)
        alone_ms = (time.perf_counter() - t) / 50 * 1000
        alone_cpu_ms = (time.process_time() - c) / 50 * 1000  # every thread of this process: the writer's too
        waits: list[float] = []

        async def one(i: int) -> None:
            t0 = time.perf_counter()
            await writer.open_attempt(f"burst-{i}", note)
            waits.append(time.perf_counter() - t0)

        t, c = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall_ms = (time.perf_counter() - t) * 1000
        burst_cpu_ms = (time.process_time() - c) / n * 1000
        waits.sort()
        print(f"one note alone: {alone_ms:.2f} ms wall, {alone_cpu_ms:.3f} ms CPU; {n} notes at once: {wall_ms:.1f} ms wall, "
              f"{burst_cpu_ms:.3f} ms CPU per note, each waits p50 {waits[n // 2] * 1000:.1f} ms, "
              f"p99 {waits[int(n * 0.99)] * 1000:.1f} ms")
        await writer.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
