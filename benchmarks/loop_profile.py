"""Where the front door's event loop spends its busy time during a gateway_load burst.

    python -m benchmarks.loop_profile OUT_PREFIX -- GATEWAY_LOAD_ARGS...
    python -m benchmarks.loop_profile --classify RAW_FILE...

Runs ``python -m taskplane.bench.gateway_load`` with the given arguments, attaches py-spy
(``pip install py-spy``: not a dependency) to the first ``taskplane gateway`` process once
it is up, and sorts the main thread's samples into what decides a route and what does not
(access-log receipt, settling and the ledger, the cost writer, the metrics scrape, ...).
A sample counts once, under the first rule its stack matches, in the order below.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import time
from pathlib import Path

RULES = [(name, re.compile(rx)) for name, rx in [
    ("cost writer (outbox, asyncpg, SQLAlchemy)", r"store/writer|store/appender|store/delivery|store/upserts|store/outbox|asyncpg|sqlalchemy|store/inflight"),
    ("metrics scrape (replicas + /metrics)", r"generate_latest|engines/metrics|engines/probe|engines/scrape|parse_metrics|engines/discovery|engines/kube_"),
    ("settling + ledger (rows, leases, counters)",
     r"PickedCall\.(begin|succeeded|failed|cancel)|AttemptLedger|epp/book|epp/calls|AttemptLifecycle\.(begin|succeeded|failed)"),
    ("access-log receipt", r"epp/accesslog"),
    ("route decision (Process, placement)", r"epp/server\.py|epp/protocol|placement|AttemptLifecycle|scheduler/"),
    ("KV events", r"kv_events|zmq"),
    ("HTTP app", r"uvicorn|fastapi|starlette|taskplane/api/|h11|http11"),
    ("timing probe / gc", r"epp/timing|gcfreeze"),
    ("prometheus updates", r"prometheus"),
]]


def classify(raw: Path) -> collections.Counter[str]:
    """Main-thread samples of a py-spy ``--format raw`` file, by category."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, n = line.rsplit(" ", 1)
        frames = stack.split(";")
        if not frames[0].startswith("_run_module_as_main"):  # other threads: the outbox's, the stall clock
            continue
        name = next((name for name, rx in RULES if rx.search(stack)), None)
        if name is None:
            name = "native loop (grpc aio, uvloop)" if frames[-1].startswith("Runner.run") else "other Python"
        counts[name] += int(n)
    return counts


def table(raws: list[Path]) -> str:
    counts = [classify(r) for r in raws]
    names = sorted(set().union(*counts), key=lambda k: -counts[0].get(k, 0))
    lines = ["| main thread, share of busy samples | " + " | ".join(r.name for r in raws) + " |",
             "|---|" + "---:|" * len(raws)]
    for k in names:
        lines.append(f"| {k} | " + " | ".join(f"{100 * c.get(k, 0) / max(1, sum(c.values())):.1f} %" for c in counts) + " |")
    lines.append("| samples | " + " | ".join(str(sum(c.values())) for c in counts) + " |")
    return "\n".join(lines)


def profile(prefix: Path, bench_args: list[str]) -> Path:
    """Run the bench, py-spy its first gateway; the raw samples' file."""
    bench = subprocess.Popen([sys.executable, "-m", "taskplane.bench.gateway_load", *bench_args],
                             stdout=open(f"{prefix}.log", "w"), stderr=subprocess.STDOUT)
    pid = ""
    while not pid and bench.poll() is None:
        time.sleep(0.1)
        pid = subprocess.run(["pgrep", "-o", "-P", str(bench.pid), "-f", "taskplane.cli gateway"],  # this bench's own
                             capture_output=True, text=True).stdout.strip()
    time.sleep(3)  # start-up is not the burst
    raw = Path(f"{prefix}.txt")
    spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--pid", pid, "-r", "200",
                            "-f", "raw", "-o", str(raw), "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bench.wait()
    spy.wait(timeout=30)  # it stops when the gateway exits
    return raw


def main() -> None:
    if sys.argv[1] == "--classify":
        print(table([Path(a) for a in sys.argv[2:]]))
        return
    sep = sys.argv.index("--")
    print(table([profile(Path(sys.argv[1]), sys.argv[sep + 1:])]))


if __name__ == "__main__":
    main()
