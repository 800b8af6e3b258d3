"""The block-hash chain as first defined (pack every token, hash block by block): the
reference that the scheduler's ``chain_hashes`` and the simulator's repeated blocks must match."""

from __future__ import annotations

import hashlib
import struct

from taskplane.scheduler.hashing import MASK64, ROOT


def reference_chain(tokens: list[int], block_size: int, parent: int = ROOT) -> list[int]:
    n = len(tokens) // block_size
    raw = struct.pack(f"<{n * block_size}q", *tokens[: n * block_size])
    out, h = [], parent & MASK64
    step = block_size * 8
    for i in range(n):
        digest = hashlib.blake2b(h.to_bytes(8, "little") + raw[i * step : (i + 1) * step], digest_size=8).digest()
        h = int.from_bytes(digest, "little")
        out.append(h)
    return out
