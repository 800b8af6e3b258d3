"""Chained block hashes of a token sequence, the key of every KV lookup.

The gateway hashes a prompt's tokens and the KV index hashes the tokens carried by vLLM's
``BlockStored`` events with this same function, so the two meet without trusting vLLM's own
hashes (which are seeded per process). A block's hash covers its parent's hash, so equal
hashes mean equal *prefixes*, not just equal blocks. Only full blocks are hashed: vLLM
caches only full blocks.

blake2b with an 8-byte digest is deterministic across processes and machines (unlike
Python's ``hash()``) and costs about half a microsecond per block.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np

#: Parent hash of a sequence's first block (a fixed constant, so every process agrees).
ROOT: int = int.from_bytes(hashlib.blake2b(b"taskplane/kv-root/v1", digest_size=8).digest(), "little")

_MASK64 = (1 << 64) - 1


_Q = struct.Struct("<q")


def _token_bytes(tokens: Sequence[int]) -> bytes:
    """Tokens as little-endian int64 bytes (packed in C: struct for lists, numpy for arrays)."""
    if isinstance(tokens, np.ndarray):
        return np.ascontiguousarray(tokens, dtype="<i8").tobytes()
    return struct.pack(f"<{len(tokens)}q", *tokens)


def _repeated(tokens: list[int] | tuple[int, ...], start: int, block_size: int) -> bytes | None:
    """The bytes of block ``tokens[start : start + block_size]`` if it is one token repeated.

    Converting a block's Python ints costs 5-15 us (wide ints: the simulator's token ids are
    63-bit content ids, each block one id repeated); repeating 8 bytes costs ~0.1 us. Two
    comparisons reject a mixed block cheaply (a real prompt), before the full count."""
    first = tokens[start]
    end = start + block_size
    if tokens[end - 1] != first or tokens[start + block_size // 2] != first:
        return None
    if tokens[start:end].count(first) != block_size:
        return None
    return _Q.pack(first) * block_size


def _block_bytes(tokens: Sequence[int], block_size: int, n_full: int) -> list[bytes]:
    """The bytes of each of the first ``n_full`` blocks of ``tokens`` (as ``_token_bytes``)."""
    step = block_size * 8
    if isinstance(tokens, list | tuple):
        out: list[bytes] = []
        for i in range(n_full):
            chunk = _repeated(tokens, i * block_size, block_size)
            if chunk is None:  # a real prompt: pack the rest in one C call
                raw = _token_bytes(tokens[i * block_size : n_full * block_size])
                out.extend(raw[j * step : (j + 1) * step] for j in range(n_full - i))
                break
            out.append(chunk)
        return out
    total = n_full * block_size
    raw = _token_bytes(tokens if len(tokens) == total else tokens[:total])
    return [raw[j * step : (j + 1) * step] for j in range(n_full)]


def chain_hashes(tokens: Sequence[int], block_size: int, parent: int = ROOT) -> list[int]:
    """Chained 64-bit hashes of the full blocks of ``tokens``.

    ``hashes[i]`` identifies ``tokens[: (i + 1) * block_size]`` following ``parent`` (pass the
    last hash of an earlier call to continue a chain). A trailing partial block is ignored.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    n_full = len(tokens) // block_size
    if n_full == 0:
        return []
    blake = hashlib.blake2b
    from_bytes = int.from_bytes
    out: list[int] = []
    h = parent & _MASK64
    for chunk in _block_bytes(tokens, block_size, n_full):
        h = from_bytes(blake(h.to_bytes(8, "little") + chunk, digest_size=8).digest(), "little")
        out.append(h)
    return out


def text_chain_hashes(text: str, chars_per_block: int = 64, parent: int = ROOT) -> list[int]:
    """Chained hashes of fixed-size character chunks, for when no tokenizer is configured.

    These live in a different hash space from token hashes, so only the approximate index
    (the gateway's own routing history) can match them; set ``CallRequest.tokenized=False``.
    """
    if chars_per_block <= 0:
        raise ValueError(f"chars_per_block must be positive, got {chars_per_block}")
    data = text.encode("utf-8")
    n_full = len(data) // chars_per_block
    blake = hashlib.blake2b
    out: list[int] = []
    h = parent & _MASK64
    for i in range(n_full):
        chunk = data[i * chars_per_block : (i + 1) * chars_per_block]
        h = int.from_bytes(blake(h.to_bytes(8, "little") + chunk, digest_size=8, person=b"tp-text").digest(), "little")
        out.append(h)
    return out
