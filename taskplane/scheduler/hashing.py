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
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Protocol

import numpy as np

#: Parent hash of a sequence's first block (a fixed constant, so every process agrees).
ROOT: int = int.from_bytes(hashlib.blake2b(b"taskplane/kv-root/v1", digest_size=8).digest(), "little")

MASK64 = (1 << 64) - 1


def adapter_root(adapter: str | None) -> int:
    """Parent hash of the first block of a call run with LoRA ``adapter`` (``ROOT`` for the
    base model): as in vLLM, one adapter's blocks never match another's or the base model's,
    so the index chains each adapter's blocks from its own root."""
    if not adapter:
        return ROOT
    return int.from_bytes(hashlib.blake2b(b"taskplane/kv-root/lora/" + adapter.encode(), digest_size=8).digest(),
                          "little")


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Tokens as little-endian int64 bytes (packed in C: struct for lists, numpy for arrays
    and for ``bytes``, the gateway's byte-level tokens, widened without an int per token)."""
    if isinstance(tokens, np.ndarray):
        return np.ascontiguousarray(tokens, dtype="<i8").tobytes()
    if isinstance(tokens, (bytes, bytearray)):
        return np.frombuffer(tokens, dtype=np.uint8).astype("<i8").tobytes()
    return struct.pack(f"<{len(tokens)}q", *tokens)


def block_hash(parent: int, chunk: bytes) -> int:
    """The hash of one block (``chunk``: its tokens as :func:`token_bytes`) after the 64-bit ``parent``."""
    return int.from_bytes(hashlib.blake2b(parent.to_bytes(8, "little") + chunk, digest_size=8).digest(), "little")


class BlockContents(Protocol):
    """Tokens that hash their own full blocks (the simulator's lazily repeated blocks).

    ``chain_hashes`` asks any token sequence with this method for its hashes first. The
    method must return exactly ``chain_hashes(list(tokens), block_size, parent)`` -- computed
    with :func:`block_hash`, so the KV index still trusts no hash it did not compute -- or
    None when it cannot (another block size), and the tokens are then packed and hashed.
    """

    def block_chain_hashes(self, block_size: int, parent: int) -> list[int] | None: ...


def chain_hashes(tokens: Sequence[int], block_size: int, parent: int = ROOT) -> list[int]:
    """Chained 64-bit hashes of the full blocks of ``tokens``.

    ``hashes[i]`` identifies ``tokens[: (i + 1) * block_size]`` following ``parent`` (pass the
    last hash of an earlier call to continue a chain). A trailing partial block is ignored.
    Tokens are packed in one C call and hashed block by block; tokens that are
    :class:`BlockContents` give their hashes themselves (the same values).
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    n_full = len(tokens) // block_size
    if n_full == 0:
        return []
    h = parent & MASK64
    own = getattr(tokens, "block_chain_hashes", None)
    if own is not None:
        hashes: list[int] | None = own(block_size, h)
        if hashes is not None:
            return hashes
        tokens = list(tokens)
    total = n_full * block_size
    rest = tokens if len(tokens) == total else tokens[:total]
    return _hash_blocks(token_bytes(rest), block_size, h)


def _hash_blocks(raw: bytes, block_size: int, parent: int) -> list[int]:
    """The chain over the packed tokens ``raw`` (whole blocks only), after ``parent``."""
    step = block_size * 8
    h = parent
    out: list[int] = []
    for j in range(len(raw) // step):
        h = block_hash(h, raw[j * step : (j + 1) * step])
        out.append(h)
    return out


class SessionChains:
    """The chain hashes of each session's latest prompt, so the session's next prompt
    hashes only the blocks that differ from it.

    An agent's prompt is mostly the previous one (history, then the reply and a tool's
    output): hashing it whole each step costs a blake2b per block of the context (about
    2 us each; 1 ms for 8k tokens) per call. The values are exactly ``chain_hashes``'s:
    shared blocks are found by comparing the tokens themselves, never trusted by key.
    Bounded: the least recently used sessions are forgotten.
    """

    def __init__(self, max_sessions: int = 4096) -> None:
        self.max_sessions = max_sessions
        self._last: OrderedDict[Hashable, tuple[tuple[int, int], bytes, list[int]]] = OrderedDict()  # shape, tokens, hashes

    def hashes(self, session: Hashable | None, tokens: Sequence[int], block_size: int, *,
               root: int = ROOT) -> list[int]:
        """``chain_hashes(tokens, block_size, root)``, reusing the previous prompt of ``session``
        (any key; the gateway's is the tenant, the session id and the adapter, so one tenant's
        prompts never meet another's, not even in how long hashing takes; a session keeps one
        ``root``)."""
        n_full = len(tokens) // block_size if block_size > 0 else 0
        if session is None or n_full == 0:
            return chain_hashes(tokens, block_size, root)
        full = tokens[: n_full * block_size]
        # the tokens as compared: bytes as they are (byte-level tokens), else packed int64
        key = bytes(full) if isinstance(full, (bytes, bytearray)) else token_bytes(full)
        shape = (block_size, len(key) // len(full))  # block size, bytes per token
        shared, hashes = 0, []
        last = self._last.pop(session, None)
        if last is not None and last[0] == shape:
            shared = _shared_blocks(last[1], key, block_size * shape[1])
            hashes = last[2][:shared]
        parent = hashes[-1] if hashes else root
        hashes += _hash_blocks(token_bytes(full[shared * block_size :]), block_size, parent)
        self._last[session] = (shape, key, hashes)
        while len(self._last) > self.max_sessions:
            self._last.popitem(last=False)
        return list(hashes)


def _shared_blocks(a: bytes, b: bytes, step: int) -> int:
    """How many leading ``step``-byte blocks ``a`` and ``b`` have in common (a binary search
    of prefix comparisons: a few memcmp calls, not one per block)."""
    n = min(len(a), len(b)) // step
    if a[: n * step] == b[: n * step]:
        return n
    lo, hi = 0, n  # the first lo blocks are equal; the first hi are not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[: mid * step] == b[: mid * step]:
            lo = mid
        else:
            hi = mid
    return lo


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
    h = parent & MASK64
    for i in range(n_full):
        chunk = data[i * chars_per_block : (i + 1) * chars_per_block]
        h = int.from_bytes(blake(h.to_bytes(8, "little") + chunk, digest_size=8, person=b"tp-text").digest(), "little")
        out.append(h)
    return out
