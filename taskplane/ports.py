"""Free TCP ports for the parts a test or `dev` starts, chosen outside the kernel's
ephemeral range.

Binding port 0 hands out an *ephemeral* port, and the kernel hands the same range to
every outgoing connection: between picking such a port and the child process binding it,
any client socket on the machine may take it ("address already in use"). Ports below the
ephemeral range are never given to client sockets, so the only race left is with another
process choosing the same random port, which the bind check below makes unlikely.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOW = 20_000
_taken: set[int] = set()  # handed out by this process: never hand one out twice


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", *, span: int = 1) -> int:
    """A port that is free now (with ``span`` > 1: the first of that many free in a row)."""
    high = max(_ephemeral_start() - span, _LOW + 1000)
    rng = random.SystemRandom()
    for _ in range(2000):
        port = rng.randrange(_LOW, high)
        block = range(port, port + span)
        if any(p in _taken for p in block):
            continue
        if all(_bindable(p, host) for p in block):
            _taken.update(block)
            return port
    raise RuntimeError(f"no free port found between {_LOW} and {high}")


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports."""
    return [free_port(host) for _ in range(count)]
